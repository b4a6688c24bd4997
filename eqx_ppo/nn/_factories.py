"""Factories for the standard networks: MLPs and the actor-critics.

Kernels are variance-scaled (fan-in, uniform; LeCun-uniform at scale 1), as
in nnx-ppo; biases are zero.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jaxtyping import Array, Key

from .._typecheck import Int, checked, each
from ..samplers import CategoricalSampler, NormalTanhSampler
from ._adapter import PPOAdapter
from ._containers import Map, Sequential
from ._conv import ConvSpec, Kind, make_cnn_encoder
from ._dense import Activation, Dense
from ._module import AbstractStatefulModule
from ._normalizer import Normalizer
from ._utils import Flattener, Splitter

Shape = Int | each(tuple, Int)
ObsSize = Int | tuple[Int, Int, Int] | each(Mapping, Shape)
Encoder = Kind | ConvSpec
ActionSize = Shape | each(Mapping, Shape)


def scaled_kernel_init(initializer_scale: float) -> Callable[..., Array]:
    if not initializer_scale > 0:
        raise ValueError(
            f"initializer_scale={initializer_scale} must be > 0; it scales the "
            "variance of the initial weights."
        )
    return jax.nn.initializers.variance_scaling(initializer_scale, "fan_in", "uniform")


def _dense_stack(
    sizes: each(Sequence, Int),
    *,
    key: Key[Array, ""],
    activation: Activation,
    activate_final: bool,
    kernel_init: Callable[..., Array],
) -> list[Dense]:
    n_layers = len(sizes) - 1
    keys = jax.random.split(key, n_layers)
    return [
        Dense(
            sizes[i],
            sizes[i + 1],
            key=keys[i],
            activation=activation if i < n_layers - 1 or activate_final else None,
            kernel_init=kernel_init,
        )
        for i in range(n_layers)
    ]


@checked
def make_mlp(
    in_size: int,
    hidden_sizes: each(Sequence, Int),
    out_size: int,
    *,
    key: Key[Array, ""],
    activation: Activation = "swish",
    activate_final: bool = False,
    initializer_scale: float = 1.0,
) -> Sequential:
    """A multi-layer perceptron: a `Sequential` of `len(hidden_sizes) + 1` `Dense`.

    **Arguments:**

    - `in_size`: input features.
    - `hidden_sizes`: widths of the hidden layers, e.g. `[64, 64]`; may be empty.
    - `out_size`: output features.
    - `key`: PRNG key for the initialisers.
    - `activation`: a name, as in [`eqx_ppo.nn.Dense`][], or a callable,
      after every hidden layer (and the output layer with `activate_final`).
    - `activate_final`: see `activation`.
    - `initializer_scale`: variance scale of the (fan-in, uniform) kernel init.
    """
    return Sequential(
        _dense_stack(
            (in_size, *hidden_sizes, out_size),
            key=key,
            activation=activation,
            activate_final=activate_final,
            kernel_init=scaled_kernel_init(initializer_scale),
        )
    )


def _preprocessing(
    obs_size: ObsSize,
    normalize_obs: bool,
    encoder: Encoder | None,
    pixel_scale: float | None,
    key: Key[Array, ""],
) -> tuple[list[AbstractStatefulModule], int]:
    """The layers before the adapter, and the feature size they produce."""
    if encoder is not None:
        if not (isinstance(obs_size, tuple) and len(obs_size) == 3):
            raise ValueError(
                f"encoder={encoder!r} reads images: obs_size={obs_size!r} must be "
                "one env's image shape (height, width, channels)."
            )
        cnn, size = make_cnn_encoder(obs_size, key=key, kind=encoder, scale=pixel_scale)
        return [cnn], size
    if pixel_scale is not None:
        raise ValueError(
            f"pixel_scale={pixel_scale!r} only applies with `encoder=` (image "
            "observations); pass encoder='nature' or 'impala_small', or drop "
            "pixel_scale."
        )
    if isinstance(obs_size, tuple):
        raise ValueError(
            f"obs_size={obs_size!r} is a shape; for image observations [H, W, C] "
            "pass encoder='nature' or 'impala_small' (a CNN encoder), for vectors "
            "an int."
        )
    if isinstance(obs_size, Mapping):
        size = sum(v if isinstance(v, int) else math.prod(v) for v in obs_size.values())
        flatten: list[AbstractStatefulModule] = [Flattener()]
        return ([Normalizer(dict(obs_size))] if normalize_obs else []) + flatten, size
    return ([Normalizer(obs_size)] if normalize_obs else []), obs_size


def _sampler(
    size: int | tuple[int, ...],
    *,
    discrete: bool,
    entropy_weight: float,
    min_std: float,
    std_scale: float,
) -> tuple[int, AbstractStatefulModule]:
    """One sampler for one action, and the number of features it reads."""
    if discrete:
        groups = size if isinstance(size, tuple) else (size,)
        return sum(groups), CategoricalSampler(entropy_weight, size)
    if isinstance(size, tuple):
        raise ValueError(
            f"action_size={size!r}: a tuple of sizes is a multi-discrete action; "
            "pass discrete=True, or an int for a continuous one."
        )
    return 2 * size, NormalTanhSampler(
        entropy_weight, min_std=min_std, std_scale=std_scale
    )


def _action_head(
    action_size: ActionSize, **sampler_kwargs: Any
) -> tuple[int, list[AbstractStatefulModule]]:
    """The layers after the actor's output layer, and that layer's size."""
    if not isinstance(action_size, Mapping):
        size, sampler = _sampler(action_size, **sampler_kwargs)
        return size, [sampler]
    sizes, samplers = {}, {}
    for name in sorted(action_size):
        sizes[name], samplers[name] = _sampler(action_size[name], **sampler_kwargs)
    return sum(sizes.values()), [Splitter(**sizes), Map(samplers)]


def actor_critic(
    make_trunk: Callable[
        [str, int, Key[Array, ""]], tuple[list[AbstractStatefulModule], int]
    ],
    obs_size: ObsSize,
    action_size: ActionSize,
    actor_hidden_sizes: each(Sequence, Int),
    critic_hidden_sizes: each(Sequence, Int),
    *,
    key: Key[Array, ""],
    activation: Activation,
    normalize_obs: bool,
    initializer_scale: float,
    encoder: Encoder | None,
    pixel_scale: float | None,
    **sampler_kwargs: Any,
) -> Sequential:
    """The actor-critic of both factories, from `make_mlp_actor_critic`'s
    arguments: the preprocessing, then a `PPOAdapter` whose ports are flat
    `Sequential`s of `make_trunk(port, features, key)` (a memory and its
    output size), the MLP and, for the actor, the action head."""
    kernel_init = scaled_kernel_init(initializer_scale)
    key, encoder_key = (key, key) if encoder is None else jax.random.split(key)
    preprocessing, features = _preprocessing(
        obs_size, normalize_obs, encoder, pixel_scale, encoder_key
    )
    head_size, head = _action_head(action_size, **sampler_kwargs)
    actor_trunk_key, actor_key, critic_trunk_key, critic_key = jax.random.split(key, 4)

    def port(name, trunk_key, mlp_key, hidden_sizes, out_size):
        trunk, trunk_size = make_trunk(name, features, trunk_key)
        mlp = _dense_stack(
            (trunk_size, *hidden_sizes, out_size),
            key=mlp_key,
            activation=activation,
            activate_final=False,
            kernel_init=kernel_init,
        )
        return [*trunk, *mlp]

    action = port("action", actor_trunk_key, actor_key, actor_hidden_sizes, head_size)
    value = port("value", critic_trunk_key, critic_key, critic_hidden_sizes, 1)
    adapter = PPOAdapter(action=Sequential([*action, *head]), value=Sequential(value))
    return Sequential([*preprocessing, adapter])


@checked
def make_mlp_actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    actor_hidden_sizes: each(Sequence, Int),
    critic_hidden_sizes: each(Sequence, Int),
    *,
    key: Key[Array, ""],
    activation: Activation = "swish",
    normalize_obs: bool = True,
    initializer_scale: float = 1.0,
    entropy_weight: float = 1e-2,
    min_std: float = 1e-1,
    std_scale: float = 1.0,
    discrete: bool = False,
    encoder: Encoder | None = None,
    pixel_scale: float | None = None,
) -> Sequential:
    """A feed-forward actor and critic, each its own MLP on the same observation.

    For an int `obs_size` and two hidden layers:

    ```python
    Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential([Dense, Dense, Dense(-> 2 * action_size), Sampler]),
            value=Sequential([Dense, Dense, Dense(-> 1)]),
        ),
    ])
    ```

    **Arguments:**

    - `obs_size`: one observation's features; a dict of sizes or shapes if a dict.
    - `action_size`: the action's size (`discrete`: categories); a dict if a dict.
    - `actor_hidden_sizes`, `critic_hidden_sizes`: hidden widths, e.g. `[64, 64]`.
    - `key`: PRNG key for the initialisers.
    - `activation`: hidden-layer activation, a name or a callable.
    - `normalize_obs`: put a running [`eqx_ppo.nn.Normalizer`][] first.
    - `initializer_scale`: variance scale of the kernel initialiser.
    - `entropy_weight`: weight of every sampler's entropy bonus.
    - `min_std`, `std_scale`: the Gaussian samplers' std floor and scale.
    - `discrete`: use [`eqx_ppo.nn.CategoricalSampler`][]s; a tuple `action_size`
      is multi-discrete.
    - `encoder`: for `(height, width, channels)` images, a CNN
      ([`eqx_ppo.nn.make_cnn_encoder`][]) in place of the normaliser.
    - `pixel_scale`: with `encoder`, multiply the pixels by this, e.g. `1 / 255`.
    """
    return actor_critic(lambda port, features, key: ([], features), **locals())
