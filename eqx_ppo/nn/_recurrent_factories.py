"""The recurrent actor-critics: `make_mlp_actor_critic`'s, with a memory
at the start of each port."""

import inspect
from collections.abc import Sequence
from typing import Any, Literal

import jax
from jaxtyping import Array, Key

from .._typecheck import Int, check_range, checked, each
from ._containers import Sequential
from ._dense import Activation, Dense
from ._factories import (
    ActionSize,
    Encoder,
    ObsSize,
    actor_critic,
    make_mlp_actor_critic,
    scaled_kernel_init,
)
from ._linear_recurrent import LRU, MinGRU
from ._recurrent import GRU, LSTM

Cell = Literal["lstm", "gru", "lru", "mingru"]


def default_lru_state_size(hidden_size: int) -> int:
    """The LRU's complex states in a memory `hidden_size` wide: half, rounded
    up, as many reals as the GRU's."""
    return -(-hidden_size // 2)


@checked
def make_recurrent_actor_critic(
    obs_size: ObsSize,
    action_size: ActionSize,
    hidden_size: int,
    *,
    key: Key[Array, ""],
    cell: Cell = "lstm",
    recurrent_critic: bool = True,
    actor_hidden_sizes: each(Sequence, Int) = (),
    critic_hidden_sizes: each(Sequence, Int) = (),
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

    Each memory is an [`eqx_ppo.nn.LSTM`][] or [`eqx_ppo.nn.GRU`][], or, as
    they are linear in their input, `Dense(-> hidden_size, activation)` then
    an [`eqx_ppo.nn.LRU`][] or [`eqx_ppo.nn.MinGRU`][]. With no hidden sizes
    the LSTM network is

    ```python
    Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential([LSTM, Dense(-> 2 * action_size), NormalTanhSampler]),
            value=Sequential([LSTM, Dense(-> 1)]),
        ),
    ])
    ```

    with the carry `{1: {"action": {0: (h, c), ...}, "value": {0: (h, c), ...}}}`.

    **Arguments:**

    - `obs_size`, `action_size`, `key`, `activation`, `normalize_obs`,
      `initializer_scale`, `entropy_weight`, `min_std`, `std_scale`,
      `discrete`, `encoder`, `pixel_scale`: as in
      [`eqx_ppo.nn.make_mlp_actor_critic`][].
    - `hidden_size`: the width of each memory.
    - `cell`: `"lstm"`, `"gru"`, `"lru"` or `"mingru"`.
    - `recurrent_critic`: give the critic a memory; `False`: a feed-forward MLP.
    - `actor_hidden_sizes`, `critic_hidden_sizes`: MLP widths after each memory.
    - `trainable_initial_state`: learn each memory's initial carry.
    - `parallel_replay`: how the LRU and MinGRU replay, as in [`eqx_ppo.nn.LRU`][].
    - `lru_state_size`: the LRU's complex states; default `hidden_size / 2`
      (see "Choosing a memory model").
    """
    arguments = locals()
    check_range("make_recurrent_actor_critic(hidden_size=", hidden_size, 1)
    if lru_state_size is not None and cell != "lru":
        raise ValueError(
            f"lru_state_size={lru_state_size!r} sizes the LRU's state, but "
            f"cell={cell!r}; pass cell='lru' or drop lru_state_size."
        )
    kernel_init = scaled_kernel_init(initializer_scale)

    def trunk(port, features, key):
        """A port's memory (for the linear recurrences, a nonlinear input
        projection and the cell) and its output size."""
        if port == "value" and not recurrent_critic:
            return [], features
        if cell in ("lstm", "gru"):
            memory = {"lstm": LSTM, "gru": GRU}[cell](
                features,
                hidden_size,
                key=key,
                kernel_init=kernel_init,
                trainable_initial_state=trainable_initial_state,
            )
            return [memory], hidden_size
        projection_key, key = jax.random.split(key)
        projection = Dense(
            features,
            hidden_size,
            key=projection_key,
            activation=activation,
            kernel_init=kernel_init,
        )
        options = dict(
            key=key,
            trainable_initial_state=trainable_initial_state,
            parallel_replay=parallel_replay,
        )
        if cell == "lru":
            n = lru_state_size
            n = default_lru_state_size(hidden_size) if n is None else n
            memory = LRU(hidden_size, n, **options)
        else:
            memory = MinGRU(
                hidden_size, hidden_size, kernel_init=kernel_init, **options
            )
        return [projection, memory], hidden_size

    shared = inspect.signature(make_mlp_actor_critic).parameters
    return actor_critic(trunk, **{name: arguments[name] for name in shared})


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
