"""POPGym-style memory tasks: discrete cards to repeat or count.

Pure-JAX versions of tasks from POPGym (Morad et al., 2023); how they differ
from POPGym, their rewards and feed-forward bounds: see the environments guide.
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Integer, PRNGKeyArray

from .._typecheck import Int, check_range, checked
from ._env import AbstractEnv, check_action
from ._state import State


def _card(cards: Integer[Array, " length"], t: Integer[Array, ""], n: int) -> Array:
    """One-hot of `cards[t]`; all zeros once the episode is over (`t == length`)."""
    length = cards.shape[0]
    index = jnp.where(t < length, cards[jnp.minimum(t, length - 1)], n)
    return jax.nn.one_hot(index, n, dtype=jnp.float32)


def _score(correct: Array, n_scored: int) -> Float[Array, ""]:
    return jnp.where(correct, 1.0, -1.0).astype(jnp.float32) / n_scored


class _AbstractChoiceEnv(AbstractEnv):
    """A task whose action is one of `n_actions` choices (one logit each) and
    whose episodes last `length` steps."""

    length: eqx.AbstractVar[int]

    @property
    def action_size(self) -> int:
        return self.n_actions

    @property
    def max_len(self) -> int:
        """The episode length, `length`: the env ends episodes itself."""
        return self.length

    def _state(
        self,
        ps: dict[str, Array],
        shown: tuple[str, ...],
        n: int,
        reward: Float[Array, ""],
        done: Float[Array, ""],
    ) -> State:
        """The state at step `ps["t"]`, showing the one-hot (of `n`) of each
        sequence `ps[k]`, `k` in `shown`, at that step, and the clock."""
        t = ps["t"]
        cards = [_card(ps[k], t, n) for k in shown]
        obs = jnp.concatenate([*cards, (t.astype(jnp.float32) / self.length)[None]])
        return State(pipeline_state=ps, obs=obs, reward=reward, done=done)


class _AbstractCardEnv(_AbstractChoiceEnv):
    """A card task: `length` cards drawn at reset, one shown per step, and a
    choice among `n_cards` as the action."""

    n_cards: eqx.AbstractVar[int]

    def __check_init__(self):
        name = type(self).__name__
        why = "two or more: with one there is nothing to recall."
        check_range(f"{name}(n_cards=", self.n_cards, 2, fix=why)
        check_range(f"{name}(length=", self.length, 2, fix=why)

    def reset(self, key: PRNGKeyArray) -> State:
        cards = jax.random.randint(key, (self.length,), 0, self.n_cards, jnp.int32)
        zero = jnp.zeros((), jnp.float32)
        ps = {"cards": cards, "t": jnp.zeros((), jnp.int32)}
        return self._state(ps, ("cards",), self.n_cards, zero, zero)

    @abc.abstractmethod
    def _reward(self, cards: Array, t: Array, action: Array) -> Float[Array, ""]:
        """The reward for answering `action` at step `t`."""

    def step(self, state: State, action: Array) -> State:
        action = check_action(self, action, (), self.n_actions)
        cards, t = state.pipeline_state["cards"], state.pipeline_state["t"]
        reward = self._reward(cards, t, action)
        done = (t + 1 >= self.length).astype(jnp.float32)
        ps = {"cards": cards, "t": t + 1}
        return self._state(ps, ("cards",), self.n_cards, reward, done)

    @property
    def observation_size(self) -> int:
        return self.n_cards + 1

    @property
    def n_actions(self) -> int:
        return self.n_cards


@checked
class RepeatPrevious(_AbstractCardEnv):
    """Output the card shown `k` steps ago (`k` at least 1): episodes of `length`
    steps (more than `k`) deal one of `n_cards` distinct cards (at least 2) a step.
    """

    n_cards: Int = eqx.field(static=True, default=4)
    k: Int = eqx.field(static=True, default=2)
    length: Int = eqx.field(static=True, default=16)

    def __check_init__(self):
        check_range("RepeatPrevious(k=", self.k, 1, fix="k >= 1: k=0 needs no memory.")
        fix = "a length above k, so that some step is scored."
        check_range("RepeatPrevious(length=", self.length, self.k + 1, fix=fix)

    def _reward(self, cards: Array, t: Array, action: Array) -> Float[Array, ""]:
        correct = action == cards[jnp.maximum(t - self.k, 0)]
        return jnp.where(t >= self.k, _score(correct, self.length - self.k), 0.0)


@checked
class RepeatFirst(_AbstractCardEnv):
    """Output the episode's first card on every step: episodes of `length` steps
    deal one of `n_cards` distinct cards a step (both at least 2)."""

    n_cards: Int = eqx.field(static=True, default=4)
    length: Int = eqx.field(static=True, default=16)

    def _reward(self, cards: Array, t: Array, action: Array) -> Float[Array, ""]:
        return _score(action == cards[0], self.length)


@checked
class CountRecall(_AbstractChoiceEnv):
    """Say how many times the queried value has been dealt so far: episodes of
    `length` steps deal one of `n_values` distinct values a step (both at least 2).
    """

    n_values: Int = eqx.field(static=True, default=4)
    length: Int = eqx.field(static=True, default=16)

    def __check_init__(self):
        fix = "two or more: with one value the count is the step number."
        check_range("CountRecall(n_values=", self.n_values, 2, fix=fix)
        fix = "two or more: with one step there is nothing to count."
        check_range("CountRecall(length=", self.length, 2, fix=fix)

    def reset(self, key: PRNGKeyArray) -> State:
        dealt_key, query_key = jax.random.split(key)
        shape = (self.length,)
        dealt = jax.random.randint(dealt_key, shape, 0, self.n_values, jnp.int32)
        queries = jax.random.randint(query_key, shape, 0, self.n_values, jnp.int32)
        # `counts[v]`: how many of `d_0, ..., d_t` equal `v`.
        counts = jax.nn.one_hot(dealt[0], self.n_values, dtype=jnp.int32)
        t, zero = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
        ps = dict(dealt=dealt, queries=queries, counts=counts, t=t)
        return self._state(ps, ("dealt", "queries"), self.n_values, zero, zero)

    def step(self, state: State, action: Array) -> State:
        action = check_action(self, action, (), self.n_actions)
        ps = state.pipeline_state
        dealt, counts, t = ps["dealt"], ps["counts"], ps["t"]
        reward = _score(action == counts[ps["queries"][t]], self.length)
        t = t + 1
        # Past the last deal `_card` is all zeros: the counts stay put.
        counts = counts + _card(dealt, t, self.n_values).astype(jnp.int32)
        done = (t >= self.length).astype(jnp.float32)
        ps = {**ps, "counts": counts, "t": t}
        return self._state(ps, ("dealt", "queries"), self.n_values, reward, done)

    @property
    def observation_size(self) -> int:
        return 2 * self.n_values + 1

    @property
    def n_actions(self) -> int:
        return self.length + 1
