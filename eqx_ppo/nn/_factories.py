"""Factories for the standard networks: MLPs and MLP / recurrent actor-critics.

Every actor-critic factory returns a [`eqx_ppo.nn.Sequential`][] whose last
layer is a [`eqx_ppo.nn.PPOAdapter`][], preceded by the observation
preprocessing:

- int `obs_size`: `{0: Normalizer, 1: adapter}`, or `{0: adapter}` with
  `normalize_obs=False`;
- dict `obs_size`: `{0: Normalizer, 1: Flattener, 2: adapter}`, or
  `{0: Flattener, 1: adapter}` with `normalize_obs=False`;
- image `obs_size` `(H, W, C)` with `encoder=...`: `{0: CNN encoder,
  1: adapter}`.

Dict observations are normalised leaf by leaf (so each key keeps its own
running statistics) and then flattened into one vector, keys in sorted order,
before both ports. `net[-1]` is always the adapter.

The adapter's ports are flat `Sequential`s: the hidden layers, the output
layer, then the action head. For two hidden layers and a continuous action
the keys are `{"action": {0, 1: Dense, 2: Dense(-> 2A), 3: NormalTanhSampler},
"value": {0, 1: Dense, 2: Dense(-> 1)}}`. With `action_size` a dict, the
action head is `Splitter` then `Map` of samplers (one per action key, in
sorted key order) and the actions are a dict. With `discrete=True` the
samplers are [`eqx_ppo.nn.CategoricalSampler`][]s and `action_size` is the
number of categories (or a tuple of them, multi-discrete).

Kernels are initialised by variance scaling, `fan_in` mode, uniform
distribution, with scale `initializer_scale` (LeCun-uniform at 1.0), as in
nnx-ppo's actor-critic factory; biases are zero.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jaxtyping import Array, PRNGKeyArray

from ..samplers import CategoricalSampler, NormalTanhSampler
from ._adapter import PPOAdapter
from ._containers import Map, Sequential
from ._conv import check_pixel_scale, make_cnn_encoder
from ._dense import Dense, check_size, get_activation
from ._keys import check_key
from ._linear_recurrent import LRU, MinGRU
from ._module import AbstractStatefulModule
from ._normalizer import Normalizer
from ._recurrent import GRU, LSTM
from ._utils import Flattener, Splitter

Activation = str | Callable[[Array], Array]
ObsSize = int | tuple[int, int, int] | Mapping[str, Any]
Encoder = str | tuple[tuple[int, int, int], ...]
ActionSize = int | tuple[int, ...] | Mapping[str, int | tuple[int, ...]]


def _kernel_init(initializer_scale: float) -> Callable[..., Array]:
    if not initializer_scale > 0:
        raise ValueError(
            f"initializer_scale={initializer_scale} must be > 0; it scales the "
            "variance of the initial weights."
        )
    return jax.nn.initializers.variance_scaling(initializer_scale, "fan_in", "uniform")


def _check_sizes(name: str, sizes: Any) -> tuple[int, ...]:
    if not isinstance(sizes, Sequence):
        raise TypeError(
            f"{name}={sizes!r} must be a list or tuple of positive ints, e.g. "
            f"[64, 64] (or [] for no hidden layer), got {type(sizes).__name__}."
        )
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        raise ValueError(
            f"{name}={sizes!r} must be a list or tuple of positive ints, e.g. "
            "[64, 64] (or [] for no hidden layer)."
        )
    return tuple(sizes)


def _dense_stack(
    sizes: Sequence[int],
    *,
    key: PRNGKeyArray,
    activation: Activation,
    activate_final: bool,
    kernel_init: Callable[..., Array],
) -> list[Dense]:
    keys = jax.random.split(key, len(sizes) - 1)
    n_layers = len(sizes) - 1
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


def make_mlp(
    in_size: int,
    hidden_sizes: Sequence[int],
    out_size: int,
    *,
    key: PRNGKeyArray,
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
    - `activation`: a name accepted by [`eqx_ppo.nn.get_activation`][] or a
      callable, applied after every hidden layer.
    - `activate_final`: also apply `activation` after the output layer.
    - `initializer_scale`: variance scale of the (fan-in, uniform) kernel init.
    """
    check_key("make_mlp", key)
    hidden_sizes = _check_sizes("make_mlp(hidden_sizes)", hidden_sizes)
    get_activation(activation)
    return Sequential(
        _dense_stack(
            (in_size, *hidden_sizes, out_size),
            key=key,
            activation=activation,
            activate_final=activate_final,
            kernel_init=_kernel_init(initializer_scale),
        )
    )


def _leaf_size(name: str, shape: Any) -> int:
    if isinstance(shape, int) and not isinstance(shape, bool) and shape > 0:
        return shape
    if isinstance(shape, tuple) and all(isinstance(d, int) and d > 0 for d in shape):
        return math.prod(shape)
    raise ValueError(
        f"obs_size entry {name!r} is {shape!r}; each entry must be a positive int "
        "or a tuple of positive ints (one env's shape)."
    )


def _preprocessing(
    obs_size: ObsSize,
    normalize_obs: bool,
    encoder: Encoder | None,
    pixel_scale: float | None,
    key: PRNGKeyArray,
) -> tuple[list[AbstractStatefulModule], int]:
    """The layers before the adapter, and the feature size they produce."""
    if encoder is not None:
        if not (isinstance(obs_size, tuple) and len(obs_size) == 3):
            raise ValueError(
                f"encoder={encoder!r} reads images: obs_size={obs_size!r} must be "
                "one env's image shape (height, width, channels)."
            )
        if pixel_scale is not None:
            check_pixel_scale("pixel_scale", pixel_scale)
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
        if not obs_size:
            raise ValueError("obs_size={} has no entries; name at least one.")
        size = sum(_leaf_size(k, v) for k, v in obs_size.items())
        flatten: list[AbstractStatefulModule] = [Flattener()]
        return ([Normalizer(dict(obs_size))] if normalize_obs else []) + flatten, size
    if isinstance(obs_size, int) and not isinstance(obs_size, bool) and obs_size > 0:
        return ([Normalizer(obs_size)] if normalize_obs else []), obs_size
    raise ValueError(
        f"obs_size={obs_size!r} must be a positive int (vector observations) or a "
        "dict from observation key to its size or shape."
    )


def _sampler(
    size: Any,
    *,
    discrete: bool,
    entropy_weight: float,
    min_std: float,
    std_scale: float,
) -> tuple[int, AbstractStatefulModule]:
    """One sampler for one action, and the number of features it reads."""
    if discrete:
        groups = size if isinstance(size, tuple) else (size,)
        if not groups or not all(isinstance(n, int) and n > 0 for n in groups):
            raise ValueError(
                f"action_size={size!r}: with discrete=True each action is a number "
                "of categories, a positive int, or a tuple of them (multi-discrete)."
            )
        return sum(groups), CategoricalSampler(entropy_weight, size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(
            f"action_size={size!r} must be a positive int for continuous actions "
            "(or pass discrete=True for categorical actions)."
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
    if not action_size:
        raise ValueError("action_size={} has no entries; name at least one action.")
    sizes, samplers = {}, {}
    for name in sorted(action_size):
        sizes[name], samplers[name] = _sampler(action_size[name], **sampler_kwargs)
    return sum(sizes.values()), [Splitter(**sizes), Map(samplers)]


def _actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    make_trunk: Callable[
        [str, int, PRNGKeyArray], tuple[list[AbstractStatefulModule], int]
    ],
    actor_hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    *,
    key: PRNGKeyArray,
    activation: Activation,
    normalize_obs: bool,
    initializer_scale: float,
    discrete: bool,
    entropy_weight: float,
    min_std: float,
    std_scale: float,
    encoder: Encoder | None,
    pixel_scale: float | None,
) -> Sequential:
    actor_hidden_sizes = _check_sizes("actor_hidden_sizes", actor_hidden_sizes)
    critic_hidden_sizes = _check_sizes("critic_hidden_sizes", critic_hidden_sizes)
    get_activation(activation)
    kernel_init = _kernel_init(initializer_scale)
    if encoder is not None:
        key, encoder_key = jax.random.split(key)
    else:
        encoder_key = key
    preprocessing, features = _preprocessing(
        obs_size, normalize_obs, encoder, pixel_scale, encoder_key
    )
    head_size, head = _action_head(
        action_size,
        discrete=discrete,
        entropy_weight=entropy_weight,
        min_std=min_std,
        std_scale=std_scale,
    )
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

    adapter = PPOAdapter(
        action=Sequential(
            [
                *port(
                    "action", actor_trunk_key, actor_key, actor_hidden_sizes, head_size
                ),
                *head,
            ]
        ),
        value=Sequential(
            port("value", critic_trunk_key, critic_key, critic_hidden_sizes, 1)
        ),
    )
    return Sequential([*preprocessing, adapter])


def make_mlp_actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    actor_hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    *,
    key: PRNGKeyArray,
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

    See the module documentation for the exact structure; for an int
    `obs_size`, two hidden layers and `normalize_obs=True` it is

    ```python
    Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential([Dense, Dense, Dense(-> 2 * action_size),
                               NormalTanhSampler(entropy_weight, min_std, std_scale)]),
            value=Sequential([Dense, Dense, Dense(-> 1)]),
        ),
    ])
    ```

    **Arguments:**

    - `obs_size`: features of one observation, or a dict from observation key
      to its size (int) or shape (tuple); dict observations are flattened.
    - `action_size`: action dimension; a dict of them for dict actions. With
      `discrete=True`: the number of categories, a tuple of them
      (multi-discrete), or a dict of either.
    - `actor_hidden_sizes`, `critic_hidden_sizes`: hidden widths, e.g. `[64, 64]`.
    - `key`: PRNG key for the initialisers.
    - `activation`: hidden-layer activation, a name (`"swish"`, `"tanh"`,
      `"relu"`, ...) or a callable.
    - `normalize_obs`: put a running [`eqx_ppo.nn.Normalizer`][] first.
    - `initializer_scale`: variance scale of the kernel initialiser.
    - `entropy_weight`: weight of every sampler's entropy bonus.
    - `min_std`, `std_scale`: the Gaussian samplers' std floor and scale. The
      factories' floor, 0.1, is higher than `NormalTanhSampler`'s own default
      (1e-3, nnx-ppo's): it keeps exploration alive on small tasks; pass
      `min_std=1e-3` for the sampler's default.
    - `discrete`: use [`eqx_ppo.nn.CategoricalSampler`][]s (integer actions).
    - `encoder`: for image observations, `obs_size` is one env's
      `(height, width, channels)` and a CNN from
      [`eqx_ppo.nn.make_cnn_encoder`][] (`"nature"`, `"impala_small"` or a
      custom spec) comes first, shared by the actor and the critic, in place
      of the normaliser (`normalize_obs` is ignored).
    - `pixel_scale`: with `encoder` (only), multiply the pixels by this
      first, e.g. `1 / 255` for `uint8` images; finite and `> 0`.
    """

    check_key("make_mlp_actor_critic", key)

    def no_trunk(port, features, key):
        del port, key
        return [], features

    return _actor_critic(
        obs_size,
        action_size,
        no_trunk,
        actor_hidden_sizes,
        critic_hidden_sizes,
        key=key,
        activation=activation,
        normalize_obs=normalize_obs,
        initializer_scale=initializer_scale,
        discrete=discrete,
        entropy_weight=entropy_weight,
        min_std=min_std,
        std_scale=std_scale,
        encoder=encoder,
        pixel_scale=pixel_scale,
    )


_CELLS = ("lstm", "gru", "lru", "mingru")


def default_lru_state_size(hidden_size: int) -> int:
    """The LRU's complex states in a memory `hidden_size` wide: half, rounded
    up, so its carry holds as many reals as the GRU's and MinGRU's."""
    return -(-hidden_size // 2)


def _cell(
    cell: str,
    features: int,
    hidden_size: int,
    *,
    key: PRNGKeyArray,
    activation: Activation,
    kernel_init: Callable[..., Array],
    trainable_initial_state: bool,
    parallel_replay: bool | None,
    lru_state_size: int | None,
) -> list[AbstractStatefulModule]:
    """The recurrent trunk of one port: the cell, and for the linear
    recurrences a nonlinear input projection in front of it."""
    if cell == "lstm":
        return [
            LSTM(
                features,
                hidden_size,
                key=key,
                kernel_init=kernel_init,
                trainable_initial_state=trainable_initial_state,
            )
        ]
    if cell == "gru":
        return [
            GRU(
                features,
                hidden_size,
                key=key,
                kernel_init=kernel_init,
                trainable_initial_state=trainable_initial_state,
            )
        ]
    projection_key, cell_key = jax.random.split(key)
    projection = Dense(
        features,
        hidden_size,
        key=projection_key,
        activation=activation,
        kernel_init=kernel_init,
    )
    if cell == "lru":
        recurrence: AbstractStatefulModule = LRU(
            hidden_size,
            default_lru_state_size(hidden_size)
            if lru_state_size is None
            else lru_state_size,
            key=cell_key,
            trainable_initial_state=trainable_initial_state,
            parallel_replay=parallel_replay,
        )
    else:
        recurrence = MinGRU(
            hidden_size,
            hidden_size,
            key=cell_key,
            kernel_init=kernel_init,
            trainable_initial_state=trainable_initial_state,
            parallel_replay=parallel_replay,
        )
    return [projection, recurrence]


def make_recurrent_actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    hidden_size: int,
    *,
    key: PRNGKeyArray,
    cell: str = "lstm",
    recurrent_critic: bool = True,
    actor_hidden_sizes: Sequence[int] = (),
    critic_hidden_sizes: Sequence[int] = (),
    activation: Activation = "swish",
    normalize_obs: bool = True,
    initializer_scale: float = 1.0,
    entropy_weight: float = 1e-2,
    min_std: float = 1e-1,
    std_scale: float = 1.0,
    discrete: bool = False,
    encoder: Encoder | None = None,
    pixel_scale: float | None = None,
    trainable_initial_state: bool = False,
    parallel_replay: bool | None = None,
    lru_state_size: int | None = None,
) -> Sequential:
    """A recurrent actor and critic, each port with its own memory, then an MLP.

    The actor (and, with `recurrent_critic=True`, the critic) gets its own
    recurrent trunk reading the (normalised, flattened) observation, so the
    memories are trained by their own losses and never interfere:

    - `cell="lstm"`: an [`eqx_ppo.nn.LSTM`][] of width `hidden_size`;
    - `cell="gru"`: an [`eqx_ppo.nn.GRU`][];
    - `cell="lru"`: `Dense(-> hidden_size, activation)` then an
      [`eqx_ppo.nn.LRU`][] with `lru_state_size` (default half of
      `hidden_size`) complex states and `hidden_size` outputs;
    - `cell="mingru"`: `Dense(-> hidden_size, activation)` then a
      [`eqx_ppo.nn.MinGRU`][].

    The linear recurrences (LRU, MinGRU) are linear in their input, so a
    nonlinear projection comes first; they replay a whole sequence with one
    associative scan instead of a length-`T` scan. With no hidden sizes the
    LSTM network is

    ```python
    Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential([LSTM, Dense(-> 2 * action_size), NormalTanhSampler]),
            value=Sequential([LSTM, Dense(-> 1)]),
        ),
    ])
    ```

    and the carry is `{1: {"action": {0: (h, c), ...}, "value": {0: (h, c), ...}}}`
    alongside the stateless layers' `()`.

    **Arguments:**

    - `obs_size`, `action_size`, `key`, `activation`, `normalize_obs`,
      `initializer_scale`, `entropy_weight`, `min_std`, `std_scale`,
      `discrete`, `encoder`, `pixel_scale`: as in
      [`eqx_ppo.nn.make_mlp_actor_critic`][].
    - `hidden_size`: the width of each memory.
    - `cell`: `"lstm"`, `"gru"`, `"lru"` or `"mingru"`.
    - `recurrent_critic`: give the critic its own memory (the default); with
      `False` the critic is a feed-forward MLP on the observation, the
      cheaper common layout of recurrent PPO.
    - `actor_hidden_sizes`, `critic_hidden_sizes`: widths of the MLP layers
      between each trunk and its output layer; default none.
    - `trainable_initial_state`: learn each memory's initial carry.
    - `parallel_replay`: how the LRU and MinGRU replay (see
      [`eqx_ppo.nn.LRU`][]): `None` picks by backend, `True` forces the
      associative scan, `False` the sequential scan of the elementwise update.
    - `lru_state_size`: the number of the LRU's complex states (the paper's
      `N`); default `hidden_size / 2` (rounded up), so its carry holds as
      many reals as the GRU's and MinGRU's. `hidden_size` doubles the state
      and costs a slower replay (see the guide "Choosing a memory model");
      the output stays `hidden_size` wide. Only with `cell="lru"`.
    """
    check_key("make_recurrent_actor_critic", key)
    if cell not in _CELLS:
        raise ValueError(
            f"cell={cell!r} is not a recurrent cell; choose one of "
            f"{', '.join(repr(c) for c in _CELLS)}."
        )
    check_size("make_recurrent_actor_critic(hidden_size=...)", hidden_size)
    if lru_state_size is not None:
        if cell != "lru":
            raise ValueError(
                f"lru_state_size={lru_state_size!r} sizes the LRU's state, but "
                f"cell={cell!r}; pass cell='lru' or drop lru_state_size."
            )
        check_size("make_recurrent_actor_critic(lru_state_size=...)", lru_state_size)
    get_activation(activation)
    kernel_init = _kernel_init(initializer_scale)

    def trunk(port, features, key):
        if port == "value" and not recurrent_critic:
            return [], features
        layers = _cell(
            cell,
            features,
            hidden_size,
            key=key,
            activation=activation,
            kernel_init=kernel_init,
            trainable_initial_state=trainable_initial_state,
            parallel_replay=parallel_replay,
            lru_state_size=lru_state_size,
        )
        return layers, hidden_size

    return _actor_critic(
        obs_size,
        action_size,
        trunk,
        actor_hidden_sizes,
        critic_hidden_sizes,
        key=key,
        activation=activation,
        normalize_obs=normalize_obs,
        initializer_scale=initializer_scale,
        discrete=discrete,
        entropy_weight=entropy_weight,
        min_std=min_std,
        std_scale=std_scale,
        encoder=encoder,
        pixel_scale=pixel_scale,
    )


def make_lstm_actor_critic(
    obs_size: ObsSize, action_size: ActionSize, lstm_size: int, **kwargs: Any
) -> Sequential:
    """[`eqx_ppo.nn.make_recurrent_actor_critic`][] with `cell="lstm"`.

    `lstm_size` is its `hidden_size`; the keyword arguments (`key=` among
    them) are its own.
    """
    if "cell" in kwargs:
        raise TypeError(
            "make_lstm_actor_critic builds LSTMs; for another cell call "
            f"make_recurrent_actor_critic(..., cell={kwargs['cell']!r})."
        )
    if isinstance(lstm_size, bool) or not isinstance(lstm_size, int) or lstm_size < 1:
        raise ValueError(f"lstm_size={lstm_size!r} must be a positive int.")
    return make_recurrent_actor_critic(
        obs_size, action_size, lstm_size, cell="lstm", **kwargs
    )
