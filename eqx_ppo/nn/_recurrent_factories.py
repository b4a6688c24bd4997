"""Factories for the recurrent actor-critics: one memory per port.

The networks are those of [`eqx_ppo.nn.make_mlp_actor_critic`][] (see
`_factories.py` for their layout) with a recurrent trunk at the start of
each port: an LSTM or a GRU, or a nonlinear projection then an LRU or a
MinGRU.
"""

from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
from jaxtyping import Array, Key

from .._typecheck import checked
from ._containers import Sequential
from ._dense import Activation, Dense
from ._factories import ActionSize, Encoder, ObsSize, actor_critic, scaled_kernel_init
from ._linear_recurrent import LRU, MinGRU
from ._module import AbstractStatefulModule
from ._recurrent import GRU, LSTM

Cell = Literal["lstm", "gru", "lru", "mingru"]


def default_lru_state_size(hidden_size: int) -> int:
    """The LRU's complex states in a memory `hidden_size` wide: half, rounded
    up, so its carry holds as many reals as the GRU's and MinGRU's."""
    return -(-hidden_size // 2)


def _cell(
    cell: Cell,
    features: int,
    hidden_size: int,
    *,
    key: Key[Array, ""],
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


@checked
def make_recurrent_actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    hidden_size: int,
    *,
    key: Key[Array, ""],
    cell: Cell = "lstm",
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
    if hidden_size < 1:
        raise ValueError(
            f"make_recurrent_actor_critic(hidden_size={hidden_size}): the width "
            "of each memory must be a positive int."
        )
    if lru_state_size is not None and cell != "lru":
        raise ValueError(
            f"lru_state_size={lru_state_size!r} sizes the LRU's state, but "
            f"cell={cell!r}; pass cell='lru' or drop lru_state_size."
        )
    kernel_init = scaled_kernel_init(initializer_scale)

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

    return actor_critic(
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


@checked
def make_lstm_actor_critic(
    obs_size: ObsSize, action_size: ActionSize, lstm_size: int, **kwargs: Any
) -> Sequential:
    """[`eqx_ppo.nn.make_recurrent_actor_critic`][] with `cell="lstm"`.

    `lstm_size` is its `hidden_size`; the keyword arguments (`key=` among
    them) are its own.
    """
    return make_recurrent_actor_critic(
        obs_size, action_size, lstm_size, cell="lstm", **kwargs
    )
