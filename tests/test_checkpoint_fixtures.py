"""Checkpoints written by an earlier release still load and resume.

`tests/fixtures/checkpoints/` was written by `tests/fixtures/make_checkpoints.py`
at the last commit before the engine redesign; see that script's docstring.
"""

import dataclasses
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import eqx_ppo
from eqx_ppo.distill import init_distillation_state, train_distillation

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_checkpoints as made  # noqa: E402


def _finite(tree):
    return all(
        bool(jnp.all(jnp.isfinite(x)))
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
    )


def test_release_ppo_checkpoint_loads_and_resumes():
    path = FIXTURES / "checkpoints" / "ppo"
    header = eqx_ppo.read_header(eqx_ppo.latest_checkpoint(path))
    assert header.step == 64
    assert header.config == made.ppo_config()
    env = eqx_ppo.envs.make("move_to_center")
    state = eqx_ppo.load_checkpoint(
        path, env=env, networks=made.ppo_networks, config=header.config
    )
    assert int(state.steps) == 64 and int(state.iteration) == 2
    assert jax.dtypes.issubdtype(state.key.dtype, jax.dtypes.prng_key)
    assert _finite(state)
    config = dataclasses.replace(
        header.config, ppo=dataclasses.replace(header.config.ppo, total_steps=96)
    )
    result = eqx_ppo.train_ppo(env, made.ppo_networks, config, initial_state=state)
    assert int(result.training_state.steps) == 96
    assert _finite(result.training_state)


@pytest.mark.slow  # 12-20 s; the PPO fixture above resumes in the default suite
def test_release_distillation_checkpoint_loads_and_resumes():
    path = FIXTURES / "checkpoints" / "distill"
    header = eqx_ppo.read_header(eqx_ppo.latest_checkpoint(path))
    assert header.config == made.distill_config()
    env = eqx_ppo.envs.make("move_to_center")
    teacher = made.teacher()
    state = eqx_ppo.load_checkpoint(
        path,
        like=lambda c: init_distillation_state(env, teacher, made.student, c),
        config=header.config,
    )
    assert int(state.steps) == 64
    assert _finite(state)
    config = dataclasses.replace(
        header.config,
        distillation=dataclasses.replace(header.config.distillation, total_steps=96),
    )
    result = train_distillation(env, teacher, made.student, config, initial_state=state)
    assert int(result.training_state.steps) == 96


@pytest.mark.slow  # 15-20 s; the test below reads the same file without training
def test_format2_checkpoint_reads_static_coefficients_as_leaves():
    import make_format2_checkpoint as made2

    path = FIXTURES / "checkpoints" / "format2"
    assert eqx_ppo.read_header(eqx_ppo.latest_checkpoint(path)).format_version == 2
    env = eqx_ppo.envs.make("move_to_center")
    state = eqx_ppo.load_checkpoint(path, env=env, networks=made2.networks)
    actor, critic = state.network.action, state.network.value
    coefficients = [
        actor.layers[1].kl_weight,
        actor.layers[1].ar1_weight,
        actor.layers[3].entropy_weight,
        critic.layers[0].kl_weight,
    ]
    assert all(
        isinstance(c, jax.Array) and c.dtype == jnp.float32 for c in coefficients
    )
    assert [float(c) for c in coefficients] == [
        float(jnp.float32(v)) for v in (0.5, 0.25, 0.02, 0.3)
    ]
    assert not any(jax.tree.leaves(eqx_ppo.nn.trainable(actor.layers[3])))
    config = dataclasses.replace(
        made2.config(), ppo=dataclasses.replace(made2.config().ppo, total_steps=64)
    )
    result = eqx_ppo.train_ppo(env, made2.networks, config, initial_state=state)
    assert int(result.training_state.steps) == 64
    assert _finite(result.training_state)


def test_format2_coefficients_come_from_the_file_like_any_leaf():
    import make_format2_checkpoint as made2

    def networks(key):
        net = made2.networks(key)
        return eqx.tree_at(lambda n: n.action.layers[3].entropy_weight, net, 0.5)

    state = eqx_ppo.load_checkpoint(
        FIXTURES / "checkpoints" / "format2",
        env=eqx_ppo.envs.make("move_to_center"),
        networks=networks,
    )
    assert float(state.network.action.layers[3].entropy_weight) == float(
        jnp.float32(0.02)
    )
