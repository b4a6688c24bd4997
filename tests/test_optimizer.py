"""The optimiser built from a learner's settings: schedules, clipping, weight decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo import PPO
from eqx_ppo.ppo._step import make_optimizer


def _first_and_last_step(config):
    """Size of the update for a unit gradient at the first and final update."""
    opt = make_optimizer(config)
    params = {"w": jnp.zeros(())}
    state = opt.init(params)
    n_updates = config.n_iterations * config.n_epochs * config.n_minibatches
    sizes = []
    # optax needs standard promotion, as in the engine (see step).
    with jax.numpy_dtype_promotion("standard"):
        for i in range(n_updates):
            updates, state = opt.update({"w": jnp.ones(())}, state, params)
            if i in (0, n_updates - 1):
                sizes.append(abs(float(updates["w"])))
    return sizes


base = dict(
    n_envs=4,
    rollout_length=2,
    total_steps=8 * 5,
    n_minibatches=2,
    n_epochs=2,
    learning_rate=0.1,
)


@pytest.mark.parametrize(
    "schedule, last_fraction",
    # 20 updates; Adam's first normalised step is 1, so the update is the lr.
    # linear: lr * (1 - 19/20); cosine: lr * (1 + cos(pi * 19/20)) / 2.
    [
        ("constant", 1.0),
        ("linear", 1 / 20),
        ("cosine", (1 + np.cos(np.pi * 19 / 20)) / 2),
    ],
)
def test_learning_rate_schedules(schedule, last_fraction):
    first, last = _first_and_last_step(PPO(**base, lr_schedule=schedule))
    assert first == pytest.approx(0.1, rel=1e-4)
    assert last == pytest.approx(0.1 * last_fraction, rel=1e-3)


def test_weight_decay_true_is_optaxs_default_and_false_is_none():
    # nnx-ppo's reading: `True` is `optax.adamw`'s default decay.
    assert PPO(**base, weight_decay=True).weight_decay == 1e-4
    assert PPO(**base, weight_decay=False).weight_decay is None


def test_gradient_clipping_and_weight_decay():
    opt = make_optimizer(PPO(**base, gradient_clipping=0.5, weight_decay=0.1))
    params = {"w": jnp.full((4,), 2.0)}
    state = opt.init(params)
    with jax.numpy_dtype_promotion("standard"):
        updates, _ = opt.update({"w": jnp.full((4,), 100.0)}, state, params)
    # Adam normalises the clipped gradient to 1 per coordinate; AdamW adds
    # wd * param = 0.2; the lr scales both: -(1 + 0.2) * 0.1.
    np.testing.assert_allclose(updates["w"], -0.12, rtol=1e-4)
