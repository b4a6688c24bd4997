"""POPGym-style memory tasks: discrete cards to repeat or count.

Pure-JAX versions of tasks from POPGym (Morad et al., 2023), written from
their definitions. Divergences from POPGym:

1. Cards are drawn independently and uniformly, not dealt from a shuffled
   deck, so the feed-forward bounds have closed forms.
2. Every observation ends with a clock `t / length`, as in `Recall`, so a
   critic can predict the remaining return. The feed-forward bounds allow a
   memoryless policy to read it.
3. A wrong answer costs as much as a right one earns, `1 / n_scored`, so
   returns lie in `[-1, 1]` and the optimum is always `1`.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ._env import AbstractEnv
from ._state import State


def _check_int(env: AbstractEnv, name: str, minimum: int, why: str) -> None:
    """Raise unless `env`'s field `name` is an int >= `minimum`, quoting the call."""
    value = getattr(env, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fields = dataclasses.fields(env)
        call = ", ".join(f"{f.name}={getattr(env, f.name)!r}" for f in fields)
        raise ValueError(
            f"`{type(env).__name__}({call})`: {name} must be an int >= {minimum} "
            f"({why})."
        )


def _card(cards: Int[Array, " length"], t: Int[Array, ""], n: int) -> Array:
    """One-hot of `cards[t]`; all zeros once the episode is over (`t == length`)."""
    length = cards.shape[0]
    index = jnp.where(t < length, cards[jnp.minimum(t, length - 1)], n)
    return jax.nn.one_hot(index, n, dtype=jnp.float32)


def _clock(t: Int[Array, ""], length: int) -> Float[Array, "1"]:
    return (t.astype(jnp.float32) / length)[None]


def _cards_state(
    cards: Int[Array, " length"],
    t: Int[Array, ""],
    n_cards: int,
    reward: Float[Array, ""],
    done: Float[Array, ""],
) -> State:
    """The state of `RepeatPrevious` and `RepeatFirst` at step `t`."""
    return State(
        pipeline_state={"cards": cards, "t": t},
        obs=jnp.concatenate([_card(cards, t, n_cards), _clock(t, cards.shape[0])]),
        reward=reward,
        done=done,
    )


def _score(correct: Array, n_scored: int) -> Float[Array, ""]:
    return jnp.where(correct, 1.0, -1.0).astype(jnp.float32) / n_scored


class _AbstractChoiceEnv(AbstractEnv):
    """What every task here shares: the action is one choice among `n_actions`,
    so a policy outputs one logit per choice and `action_size` is `n_actions`;
    every episode lasts `length` steps."""

    length: eqx.AbstractVar[int]

    @property
    def action_size(self) -> int:
        return self.n_actions

    def _check_action(self, action: object) -> Int[Array, ""]:
        """`action` as an `int32` scalar, or a `ValueError` naming the env."""
        name, n = type(self).__name__, self.n_actions
        action = jnp.asarray(action)
        if action.shape != () or not jnp.issubdtype(action.dtype, jnp.integer):
            raise ValueError(
                f"`{name}.step`: expected an integer scalar action in [0, {n}), got "
                f"dtype {action.dtype} and shape {action.shape}. Build the policy "
                f"with discrete=True and action_size={n} (the env's `n_actions`)."
            )
        return action.astype(jnp.int32)

    @property
    def max_len(self) -> int:
        """The episode length, `length`: the env ends episodes itself."""
        return self.length


class _AbstractCardEnv(_AbstractChoiceEnv):
    """What the two card tasks share: `length` cards drawn at reset, one shown
    per step (`_cards_state`), a choice among `n_cards` as the action, and the
    checks that there are at least two cards and two steps."""

    n_cards: eqx.AbstractVar[int]

    def __check_init__(self):
        _check_int(self, "n_cards", 2, "one card leaves nothing to recall")
        _check_int(self, "length", 2, "with one step there is nothing to remember")

    def reset(self, key: PRNGKeyArray) -> State:
        cards = jax.random.randint(key, (self.length,), 0, self.n_cards, jnp.int32)
        zero = jnp.zeros((), jnp.float32)
        return _cards_state(cards, jnp.zeros((), jnp.int32), self.n_cards, zero, zero)

    @property
    def observation_size(self) -> int:
        return self.n_cards + 1

    @property
    def n_actions(self) -> int:
        return self.n_cards


class RepeatPrevious(_AbstractCardEnv):
    """Output the card shown `k` steps ago.

    At reset `length` cards in `{0, ..., n_cards - 1}` are drawn independently
    and uniformly; step `t` shows card `c_t`. From step `k` on the answer is
    `c_{t - k}`, so a policy must keep the last `k` cards, in order, in its
    recurrent state.

    - **Observation**: `[one_hot(c_t), t / length]` (`Float[Array, "n_cards+1"]`;
      the one-hot is all zeros on the terminal observation).
    - **Action**: discrete, an `int32` scalar in `[0, n_cards)`: `n_actions =
      action_size = n_cards` (build the policy with `discrete=True`).
    - **Reward**: `0` on the first `k` steps (nothing to repeat yet); then
      `+1 / (length - k)` if the action is `c_{t - k}`, else `-1 / (length - k)`.
    - **Episode end**: termination after `length` steps.
    - **Optimal return**: `1`.
    - **Best feed-forward return**: `(2 - n_cards) / n_cards` in expectation,
      `-0.5` for 4 cards: `c_{t - k}` is independent of everything a memoryless
      policy sees (the current card and the clock), so any such policy is right
      with probability `1 / n_cards`. Acting at random scores the same.

    `make("repeat_previous")` is `k=2`, `length=16` (14 scored steps);
    `make("repeat_previous_hard")` is `k=8`, `length=64`; both with 4 cards.

    **Arguments:**

    - `n_cards`: the number of distinct cards, at least 2.
    - `k`: how many steps back the answer lies, at least 1.
    - `length`: the episode length in steps, more than `k`.
    """

    n_cards: int = eqx.field(static=True, default=4)
    k: int = eqx.field(static=True, default=2)
    length: int = eqx.field(static=True, default=16)

    def __check_init__(self):
        _check_int(self, "k", 1, "k=0 needs no memory")
        _check_int(self, "length", self.k + 1, "length > k, so some step is scored")

    def step(self, state: State, action: Array) -> State:
        action = self._check_action(action)
        cards, t = state.pipeline_state["cards"], state.pipeline_state["t"]
        target = cards[jnp.maximum(t - self.k, 0)]
        score = _score(action == target, self.length - self.k)
        reward = jnp.where(t >= self.k, score, jnp.zeros_like(score))
        done = (t + 1 >= self.length).astype(jnp.float32)
        return _cards_state(cards, t + 1, self.n_cards, reward, done)


class RepeatFirst(_AbstractCardEnv):
    """Output the episode's first card on every step.

    At reset `length` cards in `{0, ..., n_cards - 1}` are drawn independently
    and uniformly; step `t` shows card `c_t`, and the answer is always `c_0`:
    one card to hold while new ones keep arriving.

    - **Observation**: `[one_hot(c_t), t / length]` (`Float[Array, "n_cards+1"]`;
      the one-hot is all zeros on the terminal observation).
    - **Action**: discrete, an `int32` scalar in `[0, n_cards)`: `n_actions =
      action_size = n_cards` (build the policy with `discrete=True`).
    - **Reward**: `+1 / length` if the action is `c_0`, else `-1 / length`.
    - **Episode end**: termination after `length` steps.
    - **Optimal return**: `1`.
    - **Best feed-forward return**: `(1 + (length - 1) (2 - n_cards) / n_cards)
      / length` in expectation: right on step 0, where `c_0` is shown, then
      right with probability `1 / n_cards`, since `c_0` is independent of the
      later cards. `-0.40625` for `make("repeat_first")` (4 cards, 16 steps),
      `-0.845703125` for `make("repeat_first_hard")` (16 cards, 64 steps).

    **Arguments:**

    - `n_cards`: the number of distinct cards, at least 2.
    - `length`: the episode length in steps, at least 2.
    """

    n_cards: int = eqx.field(static=True, default=4)
    length: int = eqx.field(static=True, default=16)

    def step(self, state: State, action: Array) -> State:
        action = self._check_action(action)
        cards, t = state.pipeline_state["cards"], state.pipeline_state["t"]
        reward = _score(action == cards[0], self.length)
        done = (t + 1 >= self.length).astype(jnp.float32)
        return _cards_state(cards, t + 1, self.n_cards, reward, done)


class CountRecall(_AbstractChoiceEnv):
    """Say how many times the queried value has been dealt so far.

    At reset `length` dealt values `d_t` and `length` query values `q_t` in
    `{0, ..., n_values - 1}` are drawn independently and uniformly. Step `t`
    shows `d_t` and `q_t`; the answer is the number of times `q_t` appears
    among `d_0, ..., d_t` (this step's deal included), so a policy must keep a
    running count of every value.

    - **Observation**: `[one_hot(d_t), one_hot(q_t), t / length]`
      (`Float[Array, "2*n_values+1"]`; the one-hots are all zeros on the
      terminal observation).
    - **Action**: discrete, the count, an `int32` scalar in `[0, length]`:
      `n_actions = action_size = length + 1` (build the policy with
      `discrete=True`).
    - **Reward**: `+1 / length` for the right count, else `-1 / length`.
    - **Episode end**: termination after `length` steps.
    - **Optimal return**: `1`.
    - **Best feed-forward return**: `(1 / length) sum_{t < length} (2 m_t - 1)`
      in expectation, with `m_t` the largest probability of a
      `Binomial(t, 1 / n_values)`. The count is `[d_t == q_t]` (seen) plus how
      many of the `t` earlier deals equal `q_t`, which is `Binomial(t, 1 /
      n_values)` whatever the observation; the best memoryless policy answers
      `[d_t == q_t]` plus that binomial's mode (it needs the clock to know `t`;
      without it, it scores less). `-0.2068` for `make("count_recall")` (4
      values, 16 steps), `-0.4488` for `make("count_recall_hard")` (8 values,
      64 steps). Acting at random scores `2 / (length + 1) - 1`.

    **Arguments:**

    - `n_values`: the number of distinct values, at least 2.
    - `length`: the episode length in steps, at least 2.
    """

    n_values: int = eqx.field(static=True, default=4)
    length: int = eqx.field(static=True, default=16)

    def __check_init__(self):
        _check_int(self, "n_values", 2, "with one value the count is t + 1")
        _check_int(self, "length", 2, "with one step there is nothing to count")

    def _state(
        self,
        dealt: Int[Array, " length"],
        queries: Int[Array, " length"],
        counts: Int[Array, " n_values"],
        t: Int[Array, ""],
        reward: Float[Array, ""],
        done: Float[Array, ""],
    ) -> State:
        obs = jnp.concatenate(
            [
                _card(dealt, t, self.n_values),
                _card(queries, t, self.n_values),
                _clock(t, self.length),
            ]
        )
        return State(
            # `counts[v]`: how many of `d_0, ..., d_t` equal `v`.
            pipeline_state={
                "dealt": dealt,
                "queries": queries,
                "counts": counts,
                "t": t,
            },
            obs=obs,
            reward=reward,
            done=done,
        )

    def reset(self, key: PRNGKeyArray) -> State:
        dealt_key, query_key = jax.random.split(key)
        shape = (self.length,)
        dealt = jax.random.randint(dealt_key, shape, 0, self.n_values, jnp.int32)
        queries = jax.random.randint(query_key, shape, 0, self.n_values, jnp.int32)
        counts = jax.nn.one_hot(dealt[0], self.n_values, dtype=jnp.int32)
        zero = jnp.zeros((), jnp.float32)
        return self._state(dealt, queries, counts, jnp.zeros((), jnp.int32), zero, zero)

    def step(self, state: State, action: Array) -> State:
        action = self._check_action(action)
        ps = state.pipeline_state
        dealt, queries, counts, t = ps["dealt"], ps["queries"], ps["counts"], ps["t"]
        reward = _score(action == counts[queries[t]], self.length)
        t = t + 1
        # Past the last deal `_card` is all zeros: the counts stay put.
        counts = counts + _card(dealt, t, self.n_values).astype(jnp.int32)
        done = (t >= self.length).astype(jnp.float32)
        return self._state(dealt, queries, counts, t, reward, done)

    @property
    def observation_size(self) -> int:
        return 2 * self.n_values + 1

    @property
    def n_actions(self) -> int:
        return self.length + 1
