"""The recurrent factory with every cell: structure, training, vmap over seeds,
checkpoint resume, recording shapes, and its argument errors."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import eqx_ppo
from eqx_ppo import nn

CELLS = ("lstm", "gru", "lru", "mingru")
HIDDEN = 6


def _config(total_steps=32, n_seeds=2):
    return eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4, rollout_length=8, total_steps=total_steps, n_minibatches=2
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        n_seeds=n_seeds,
        progress=False,
    )


def _networks(cell):
    return lambda key: nn.make_recurrent_actor_critic(2, 1, HIDDEN, cell=cell, key=key)


@pytest.mark.parametrize(
    "cell",
    # A whole train / save / load / resume / record cycle per cell (about
    # 30 s each): with the slow tests. The default suite covers each layer's
    # replay, checkpoint leaves and recording in its own tests.
    [pytest.param(c, marks=pytest.mark.slow) for c in CELLS],
)
def test_cell_trains_over_seeds_resumes_and_records(cell, tmp_path):
    env = eqx_ppo.envs.make("recall")
    networks = _networks(cell)
    result = eqx_ppo.train(env, networks, _config())
    state = result.training_state
    assert state.steps.shape == (2,) and int(state.steps[0]) == 32
    params = eqx.filter(state.network, eqx_ppo.nn.trainable(state.network))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))

    one = eqx_ppo.select_seed(state, 0)
    eqx_ppo.save_checkpoint(tmp_path, one, config=_config(n_seeds=1), step=32)
    loaded = eqx_ppo.load_checkpoint(tmp_path, env=env, networks=networks)
    assert all(
        bool(jnp.array_equal(a, b))
        for a, b in zip(
            jax.tree.leaves(loaded.network), jax.tree.leaves(one.network), strict=True
        )
    )
    config = dataclasses.replace(
        _config(n_seeds=1),
        learner=dataclasses.replace(_config().learner, total_steps=64),
    )
    resumed = eqx_ppo.train(env, networks, config, initial_state=loaded)
    assert int(resumed.training_state.steps) == 64

    activations, _ = eqx_ppo.record_activations_rollout(
        env, one.network, n_envs=3, max_episode_length=5, key=jax.random.key(0)
    )
    memory = activations[1]["action"][1 if cell in ("lru", "mingru") else 0]
    assert memory.shape == (5, 3, HIDDEN) and memory.dtype == jnp.float32


@pytest.mark.parametrize("cell", CELLS)
def test_feed_forward_critic_has_no_carry(cell):
    net = nn.make_recurrent_actor_critic(
        3, 2, HIDDEN, cell=cell, recurrent_critic=False, key=jax.random.key(0)
    )
    carry = net.initial_state()
    assert jax.tree.leaves(carry[1]["action"])
    assert not jax.tree.leaves(carry[1]["value"])
    out = net(carry, jnp.ones(3), key=jax.random.key(1))
    assert out.output.value_estimates.shape == ()


def test_lstm_shortcut_is_the_lstm_cell():
    key = jax.random.key(3)
    a = nn.make_lstm_actor_critic(3, 2, HIDDEN, key=key)
    b = nn.make_recurrent_actor_critic(3, 2, HIDDEN, cell="lstm", key=key)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert all(
        bool(jnp.array_equal(x, y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_bad_cell_and_hidden_size_name_the_argument():
    # Declared types, checked at run time in the suite: the cell's names and
    # an int size.
    with pytest.raises(TypeError, match=r"cell.*'lstm', 'gru', 'lru'"):
        nn.make_recurrent_actor_critic(3, 2, 4, cell="rnn", key=jax.random.key(0))
    with pytest.raises(TypeError, match="hidden_size"):
        nn.make_recurrent_actor_critic(3, 2, 2.5, key=jax.random.key(0))
    # A range the type cannot say: the factory names its own argument.
    with pytest.raises(ValueError, match=r"\(hidden_size=0\): must be >= 1"):
        nn.make_recurrent_actor_critic(3, 2, 0, key=jax.random.key(0))


def test_lru_state_size_sets_the_complex_states_and_keeps_the_output_width():
    key = jax.random.key(0)
    default = nn.make_recurrent_actor_critic(3, 2, HIDDEN, cell="lru", key=key)
    full = nn.make_recurrent_actor_critic(
        3, 2, HIDDEN, cell="lru", lru_state_size=HIDDEN, key=key
    )
    odd = nn.make_recurrent_actor_critic(3, 2, 5, cell="lru", key=key)
    assert odd[-1].action.layers[1].hidden_size == 3  # 5 / 2, rounded up
    for net, states in ((default, HIDDEN // 2), (full, HIDDEN)):
        for port in (net[-1].action, net[-1].value):
            lru = port.layers[1]
            assert isinstance(lru, nn.LRU)
            assert (lru.in_size, lru.hidden_size, lru.out_size) == (
                HIDDEN,
                states,
                HIDDEN,
            )
        carry = net.initial_state()[1]["action"][1]
        assert [part.shape for part in carry] == [(states,), (states,)]
    out = full(full.initial_state(), jnp.ones(3), key=jax.random.key(1))
    assert out.output.actions.shape == (2,)
    with pytest.raises(ValueError, match=r"lru_state_size=4 .*cell='gru'"):
        nn.make_recurrent_actor_critic(
            3, 2, HIDDEN, cell="gru", lru_state_size=4, key=key
        )
    with pytest.raises(TypeError, match="lru_state_size"):
        nn.make_recurrent_actor_critic(
            3, 2, HIDDEN, cell="lru", lru_state_size=2.5, key=key
        )


def test_pixel_observations_go_through_a_shared_cnn_encoder():
    net = nn.make_recurrent_actor_critic(
        (24, 24, 3),
        5,
        HIDDEN,
        cell="mingru",
        discrete=True,
        encoder=((8, 4, 2), (8, 3, 2)),
        pixel_scale=1 / 255,
        key=jax.random.key(0),
    )
    assert [type(layer).__name__ for layer in net.layers[0].layers] == [
        "PixelScale",
        "Conv2d",
        "Conv2d",
        "Flattener",
        "Dense",
    ]
    image = jax.random.randint(jax.random.key(1), (24, 24, 3), 0, 256).astype(jnp.uint8)
    out = net(net.initial_state(), image, key=jax.random.key(2))
    assert out.output.actions.shape == () and 0 <= int(out.output.actions) < 5
    with pytest.raises(ValueError, match=r"Conv2d\(in_channels=3\)"):
        net(net.initial_state(), image[..., :1], key=jax.random.key(2))
    with pytest.raises(ValueError, match="obs_size=.*encoder="):
        nn.make_mlp_actor_critic((24, 24, 3), 2, [4], [4], key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"obs_shape=\(8, 8, 3\)"):
        nn.make_mlp_actor_critic(
            (8, 8, 3), 2, [4], [4], encoder="nature", key=jax.random.key(0)
        )


def test_parallel_replay_reaches_the_linear_cells():
    for cell in ("lru", "mingru"):
        for choice in (None, True, False):
            net = nn.make_recurrent_actor_critic(
                3, 2, 4, cell=cell, parallel_replay=choice, key=jax.random.key(0)
            )
            ports = net[-1].action.layers[1], net[-1].value.layers[1]
            assert all(p.parallel_replay is choice for p in ports)
