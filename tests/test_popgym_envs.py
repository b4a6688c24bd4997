"""The POPGym-style memory envs: exact transitions, documented returns, protocol."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo.envs import make, registered_names
from eqx_ppo.envs._popgym import CountRecall, RepeatFirst, RepeatPrevious

POPGYM_NAMES = (
    "count_recall",
    "count_recall_hard",
    "repeat_first",
    "repeat_first_hard",
    "repeat_previous",
    "repeat_previous_hard",
)
# The best feed-forward returns the environments guide states.
DOCUMENTED_FEED_FORWARD = {
    "count_recall": -0.2068,
    "count_recall_hard": -0.4488,
    "repeat_first": -0.40625,
    "repeat_first_hard": -0.845703125,
    "repeat_previous": -0.5,
    "repeat_previous_hard": -0.5,
}


def rollouts(env, policies, keys):
    """Full episodes from each key's reset, one per policy, in a single scan.

    `policy(state) -> int32 action`. Returns, per policy, the stacked post-step
    states (leaves `[len(keys), env.length, ...]`).
    """

    def episodes(key):
        def body(states, _):
            states = tuple(
                env.step(s, policy(s))
                for s, policy in zip(states, policies, strict=True)
            )
            return states, states

        start = (env.reset(key),) * len(policies)
        return jax.lax.scan(body, start, None, length=env.length)[1]

    return jax.vmap(episodes)(keys)


def step_with(env, state, actions):
    """Step `state` with each action in turn; the states after each step."""
    out = []
    for a in actions:
        state = env.step(state, jnp.asarray(a, jnp.int32))
        out.append(state)
    return out


def card(obs, n):
    return jnp.argmax(obs[:n]).astype(jnp.int32)


def clock_step(obs, length):
    return jnp.round(obs[-1] * length).astype(jnp.int32)


# Oracles: they read the env state.


def repeat_previous_oracle(env):
    def policy(state):
        ps = state.pipeline_state
        return ps["cards"][jnp.maximum(ps["t"] - env.k, 0)]

    return policy


def repeat_first_oracle(state):
    return state.pipeline_state["cards"][0]


def count_recall_oracle(state):
    ps = state.pipeline_state
    return ps["counts"][ps["queries"][ps["t"]]]


# Best memoryless policies: they read only the observation.


def copy_card(env):
    return lambda state: card(state.obs, env.n_cards)


def binomial_modes(t_max, p):
    """`modes[t]`: the most likely value of a `Binomial(t, p)`, and its probability."""
    modes, peaks = [], []
    for t in range(t_max + 1):
        pmf = [math.comb(t, k) * p**k * (1 - p) ** (t - k) for k in range(t + 1)]
        modes.append(int(np.argmax(pmf)))
        peaks.append(max(pmf))
    return modes, peaks


def count_recall_feed_forward(env):
    n = env.n_values
    modes = jnp.array(binomial_modes(env.length - 1, 1 / n)[0], jnp.int32)

    def policy(state):
        obs = state.obs
        seen = (card(obs, n) == card(obs[n:], n)).astype(jnp.int32)
        return seen + modes[clock_step(obs, env.length)]

    return policy


def feed_forward_formula(name):
    """The environments guide's closed form, in Python floats."""
    env = make(name)
    if isinstance(env, RepeatPrevious):
        return (2 - env.n_cards) / env.n_cards
    if isinstance(env, RepeatFirst):
        n, length = env.n_cards, env.length
        return (1 + (length - 1) * (2 - n) / n) / length
    peaks = binomial_modes(env.length - 1, 1 / env.n_values)[1]
    return sum(2 * m - 1 for m in peaks) / env.length


# Hand-worked transitions.


def test_repeat_previous_transitions():
    env = RepeatPrevious(n_cards=3, k=2, length=5)
    state = env.reset(jax.random.key(0))
    cards = state.pipeline_state["cards"]
    assert cards.shape == (5,) and cards.dtype == jnp.int32
    np.testing.assert_array_equal(state.obs, np.r_[np.eye(3)[int(cards[0])], 0.0])
    cards = jnp.array([2, 0, 1, 1, 0], jnp.int32)
    state = state.replace(
        pipeline_state={"cards": cards, "t": jnp.zeros((), jnp.int32)}
    )
    # Steps 0, 1 are unscored; step 2 wants cards[0] = 2, step 3 cards[1] = 0,
    # step 4 cards[2] = 1. Scored steps: 5 - 2 = 3, so +-1/3.
    right = step_with(env, state, [0, 0, 2, 0, 1])
    wrong = step_with(env, state, [2, 1, 0, 1, 0])
    np.testing.assert_allclose([s.reward for s in right], [0, 0, 1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(
        [s.reward for s in wrong], [0, 0, -1 / 3, -1 / 3, -1 / 3]
    )
    assert [float(s.done) for s in right] == [0, 0, 0, 0, 1]
    # After step t the observation shows cards[t + 1] and the clock (t + 1) / 5;
    # the terminal observation shows no card.
    np.testing.assert_allclose(right[0].obs, [1, 0, 0, 0.2])
    np.testing.assert_allclose(right[2].obs, [0, 1, 0, 0.6])
    np.testing.assert_allclose(right[4].obs, [0, 0, 0, 1.0])


def test_repeat_first_transitions():
    env = RepeatFirst(n_cards=3, length=4)
    state = env.reset(jax.random.key(1))
    cards = jnp.array([1, 2, 2, 0], jnp.int32)
    state = state.replace(
        pipeline_state={"cards": cards, "t": jnp.zeros((), jnp.int32)}
    )
    # The answer is cards[0] = 1 on every step: +-1/4.
    states = step_with(env, state, [1, 2, 1, 0])
    np.testing.assert_allclose([s.reward for s in states], [0.25, -0.25, 0.25, -0.25])
    assert [float(s.done) for s in states] == [0, 0, 0, 1]
    np.testing.assert_allclose(states[0].obs, [0, 0, 1, 0.25])
    np.testing.assert_allclose(states[2].obs, [1, 0, 0, 0.75])


def test_count_recall_transitions():
    env = CountRecall(n_values=3, length=4)
    assert (env.observation_size, env.action_size, env.n_actions) == (7, 5, 5)
    state = env.reset(jax.random.key(2))
    ps = state.pipeline_state
    # The reset counts hold the first deal.
    np.testing.assert_array_equal(ps["counts"], np.eye(3)[int(ps["dealt"][0])])
    np.testing.assert_array_equal(
        state.obs,
        np.r_[np.eye(3)[int(ps["dealt"][0])], np.eye(3)[int(ps["queries"][0])], 0.0],
    )
    dealt = jnp.array([1, 1, 0, 1], jnp.int32)
    queries = jnp.array([1, 0, 1, 2], jnp.int32)
    state = state.replace(
        pipeline_state={
            "dealt": dealt,
            "queries": queries,
            "counts": jnp.array([0, 1, 0], jnp.int32),
            "t": jnp.zeros((), jnp.int32),
        }
    )
    # Deals 1, 1, 0, 1; queries 1, 0, 1, 2. Counts including this step's deal:
    # step 0: value 1 dealt once -> 1; step 1: value 0 not yet -> 0;
    # step 2: value 1 twice -> 2; step 3: value 2 never -> 0.
    right = step_with(env, state, [1, 0, 2, 0])
    np.testing.assert_allclose([s.reward for s in right], [0.25] * 4)
    # Off by one on steps 0 and 2; a count that is never right (4) on step 3.
    wrong = step_with(env, state, [0, 0, 3, 4])
    np.testing.assert_allclose([s.reward for s in wrong], [-0.25, 0.25, -0.25, -0.25])
    assert [float(s.done) for s in right] == [0, 0, 0, 1]
    np.testing.assert_array_equal(right[2].pipeline_state["counts"], [1, 3, 0])
    # After step 0: deal 1 and query 0 shown, clock 1/4.
    np.testing.assert_allclose(right[0].obs, [0, 1, 0, 1, 0, 0, 0.25])
    np.testing.assert_allclose(right[3].obs, [0, 0, 0, 0, 0, 0, 1.0])


# Documented returns.


def oracle(env):
    if isinstance(env, RepeatPrevious):
        return repeat_previous_oracle(env)
    if isinstance(env, RepeatFirst):
        return repeat_first_oracle
    return count_recall_oracle


def feed_forward(env):
    if isinstance(env, CountRecall):
        return count_recall_feed_forward(env)
    return copy_card(env)


@eqx.filter_jit
def documented_returns(env, keys):
    """The oracle's episodes, and the returns of two memoryless policies."""
    constant = lambda s: jnp.int32(0)  # noqa: E731
    optimal, best, constant = rollouts(
        env, (oracle(env), feed_forward(env), constant), keys
    )
    return optimal, jnp.sum(best.reward, 1), jnp.sum(constant.reward, 1)


@pytest.mark.parametrize("name", POPGYM_NAMES)
def test_optimal_and_feed_forward_returns(name, getkey):
    env = make(name)
    documented = DOCUMENTED_FEED_FORWARD[name]
    assert feed_forward_formula(name) == pytest.approx(documented, abs=5e-5)
    n_episodes = 4096
    optimal, best, constant = documented_returns(
        env, jax.random.split(getkey(), n_episodes)
    )
    # The oracle: termination on the last step only, and every scored step
    # earns +1/n_scored, so the return is 1.
    np.testing.assert_array_equal(optimal.done[:, -1], 1.0)
    np.testing.assert_array_equal(optimal.done[:, :-1], 0.0)
    np.testing.assert_allclose(jnp.sum(optimal.reward, 1), 1.0, rtol=1e-6)
    # The best memoryless policy: the mean of 4096 episodes lies within 5
    # standard errors of the documented expectation.
    stderr = float(jnp.std(best)) / math.sqrt(n_episodes)
    assert 0 < stderr < 0.01
    assert abs(float(jnp.mean(best)) - documented) < 5 * stderr
    # Another memoryless policy, always answering 0, does no better.
    assert float(jnp.mean(constant)) < documented + 5 * stderr


# Protocol, registry, errors.


def test_registered():
    assert set(POPGYM_NAMES) <= set(registered_names())
    sizes = {name: make(name) for name in POPGYM_NAMES}
    assert {
        name: (env.observation_size, env.action_size, env.n_actions, env.length)
        for name, env in sizes.items()
    } == {
        "count_recall": (9, 17, 17, 16),
        "count_recall_hard": (17, 65, 65, 64),
        "repeat_first": (5, 4, 4, 16),
        "repeat_first_hard": (17, 16, 16, 64),
        "repeat_previous": (5, 4, 4, 16),
        "repeat_previous_hard": (5, 4, 4, 64),
    }
    assert make("repeat_previous_hard").k == 8
    # They end by themselves: no wrapper unless asked for.
    assert isinstance(make("repeat_previous"), RepeatPrevious)
    wrapped = make("count_recall", episode_length=8, n_values=3)
    assert wrapped.max_len == 8 and wrapped.n_actions == 17
    assert wrapped.unwrapped == CountRecall(n_values=3)


# The hard settings run the same code with other sizes; `test_envs.py` checks
# the protocol for every registered name.
@pytest.mark.parametrize("name", ["count_recall", "repeat_first", "repeat_previous"])
def test_jit_vmap_and_compile_once(name, getkey):
    env = make(name)
    keys = jax.random.split(getkey(), 3)
    states = jax.jit(jax.vmap(env.reset))(keys)
    step = jax.jit(eqx.debug.assert_max_traces(jax.vmap(env.step), max_traces=1))
    actions = jnp.zeros(3, jnp.int32)
    stepped = step(states, actions)
    stepped = step(stepped, actions + 1)
    # Reset and step states agree in structure, shapes, dtypes and weak types.
    aval = lambda x: (x.shape, x.dtype, x.weak_type)  # noqa: E731
    assert jax.tree.map(aval, states) == jax.tree.map(aval, stepped)
    assert stepped.obs.shape == (3, env.observation_size)
    assert stepped.reward.dtype == stepped.done.dtype == jnp.float32
    np.testing.assert_array_equal(states.obs[1], jax.jit(env.reset)(keys[1]).obs)


def test_categorical_policy_runs_episodes(getkey):
    # The library's discrete path end to end: CategoricalSampler actions step
    # the env, and every episode ends after `length` steps.
    env = make("count_recall")
    net = eqx_ppo.make_mlp_actor_critic(
        env.observation_size, env.n_actions, [8], [8], key=getkey(), discrete=True
    )
    metrics = eqx.filter_jit(eqx_ppo.eval_rollout)(
        env, eqx.nn.inference_mode(net), getkey(), n_envs=4, max_episode_length=20
    )
    assert float(metrics["eval/lifespan/mean"]) == 16.0
    assert -1.0 <= float(metrics["eval/episode_reward/mean"]) <= 1.0


@pytest.mark.parametrize(
    "make_env, match",
    [
        (
            lambda: RepeatPrevious(n_cards=1),
            r"RepeatPrevious\(n_cards=1\): must be >= 2",
        ),
        (lambda: RepeatPrevious(k=0), r"RepeatPrevious\(k=0\): must be >= 1. Fix"),
        (lambda: RepeatPrevious(k=4, length=4), r"\(length=4\): must be >= 5. Fix"),
        (lambda: RepeatFirst(n_cards=0), r"RepeatFirst\(n_cards=0\): must be >= 2"),
        (lambda: RepeatFirst(length=1), r"RepeatFirst\(length=1\): must be >= 2"),
        (lambda: CountRecall(n_values=1), r"CountRecall\(n_values=1\): must be >= 2"),
        (lambda: make("count_recall", length=0), r"\(length=0\): must be >= 2. Fix"),
    ],
)
def test_bad_constructor_arguments(make_env, match):
    with pytest.raises(ValueError, match=match):
        make_env()


def test_counts_must_be_ints(unchecked):
    with pytest.raises(TypeError, match=r"length=True violates type hint"):
        CountRecall(length=True)
    with pytest.raises(TypeError, match=r"k=1.5 violates type hint"):
        RepeatPrevious(k=1.5)


@pytest.mark.parametrize(
    "env, action",
    [
        (RepeatPrevious(), jnp.zeros(4)),
        (RepeatFirst(), jnp.zeros((), jnp.float32)),
        (CountRecall(), jnp.zeros(1, jnp.int32)),
    ],
)
def test_wrong_action_type(env, action):
    name = type(env).__name__
    with pytest.raises(ValueError, match=rf"{name}.step.*discrete=True"):
        env.step(env.reset(jax.random.key(0)), action)
