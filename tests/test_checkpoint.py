"""Checkpoints: exact resume (in a new process), atomic writes, clear errors."""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
import eqx_ppo.checkpoint as ckpt
from eqx_ppo import Distillation
from eqx_ppo.checkpoint._codec import config_differences
from eqx_ppo.checkpoint._files import step_of
from eqx_ppo.envs import State
from eqx_ppo.logging import LoggingLevel
from eqx_ppo.ppo import (
    PPO,
    EvalConfig,
    TrainConfig,
    VideoConfig,
    train,
)
from eqx_ppo.ppo._train import _initial_states as init_state
from tests._helpers import cpu_child_env

TESTS = pathlib.Path(__file__).parent
ITERATION = 4 * 8  # env steps per iteration in `ppo_setup`


def ppo_setup(n_seeds=1, reset_mode="cached"):
    """A recurrent policy (LSTM carries, normaliser statistics) on an env whose
    episodes (20 steps) straddle iterations (8 steps), with a linear schedule."""
    env = eqx_ppo.envs.make("move_to_center")

    def networks(key):
        return eqx_ppo.make_lstm_actor_critic(2, 2, 8, key=key)

    config = TrainConfig(
        learner=PPO(
            n_envs=4,
            rollout_length=8,
            total_steps=6 * ITERATION,
            n_minibatches=2,
            n_epochs=2,
            learning_rate=3e-3,
            lr_schedule="linear",
            reset_mode=reset_mode,
            logging_level=LoggingLevel.LOSSES
            | LoggingLevel.GRAD_NORM
            | LoggingLevel.ROLLOUT_STATS,
        ),
        eval=EvalConfig(every_steps=3 * ITERATION, n_envs=4, max_episode_length=10),
        checkpoint_every_steps=2 * ITERATION,
        seed=5,
        n_seeds=n_seeds,
        progress=False,
    )
    return env, networks, config


class KeyEnv(eqx.Module):
    """An env whose state holds a PRNG key (as stochastic envs do)."""

    observation_size: int = 2
    action_size: int = 2

    def reset(self, key):
        return State(key, jax.random.normal(key, (2,)), jnp.zeros(()), jnp.zeros(()))

    def step(self, state, action):
        del action
        key, sub = jax.random.split(state.pipeline_state)
        return State(key, jax.random.normal(sub, (2,)), jnp.zeros(()), jnp.zeros(()))


def small_setup():
    env = KeyEnv()

    def networks(key):
        return eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=key)

    config = TrainConfig(
        learner=PPO(n_envs=2, rollout_length=2, n_minibatches=1), progress=False
    )
    return env, networks, config


def host(tree):
    """Arrays as numpy (keys as key data), for exact comparison."""

    def leaf(x):
        if eqx.is_array(x) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return ("key", str(x.dtype), np.asarray(jax.random.key_data(x)))
        return np.asarray(x) if eqx.is_array(x) else x

    return jax.tree.map(leaf, tree)


def assert_identical(a, b):
    leaves_a, leaves_b = jax.tree.leaves(host(a)), jax.tree.leaves(host(b))
    assert jax.tree.structure(host(a)) == jax.tree.structure(host(b))
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One complete checkpoint of a small state (with keys in the env state)."""
    env, networks, config = small_setup()
    state = init_state(env, networks, config)
    directory = tmp_path_factory.mktemp("saved")
    path = ckpt.save_checkpoint(
        directory, state, config=config, step=7, metadata={"hidden": [4]}
    )
    return path, state


def copy(saved, tmp_path):
    path, state = saved
    target = tmp_path / "ckpt" / path.name
    shutil.copytree(path, target)
    return target, state


def sealed(body):
    """A header file: `body`, the bytes of a JSON object up to its last field,
    then `"header_sha256"`, the SHA-256 of `body`, as `save_checkpoint`
    writes it (so a test can write a header that passes the checksum)."""
    digest = hashlib.sha256(body).hexdigest()
    return body + f',\n "header_sha256": "{digest}"\n}}\n'.encode()


def rewrite_header(path, edit):
    """Apply `edit` to the checkpoint's header fields and write the result
    with a matching checksum, as a writer of such a header would."""
    header = json.loads((path / "header.json").read_text())
    header.pop("header_sha256", None)
    edit(header)
    body = json.dumps(header, indent=1).encode().removesuffix(b"\n}")
    (path / "header.json").write_bytes(sealed(body))


_RESUME_SCRIPT = """
import json, pathlib, sys
sys.path.insert(0, {tests!r})
import jax
jax.config.update("jax_numpy_dtype_promotion", "strict")
import eqx_ppo.checkpoint as ckpt
from eqx_ppo.ppo import train
from test_checkpoint import ppo_setup

source, out = sys.argv[1], pathlib.Path(sys.argv[2])
env, networks, _ = ppo_setup()
config = ckpt.read_header(source).config
state = ckpt.load_checkpoint(source, env=env, networks=networks, config=config)
logs = []
result = train(env, networks, config, initial_state=state,
                   log_fn=lambda m, s: logs.append([s, m]))
ckpt.save_checkpoint(out, result.training_state, config=config, step=result.total_steps)
(out / "logs.json").write_text(json.dumps(logs))
"""


@pytest.mark.slow  # 20-40 s; in-process resume is tested by the default suite
def test_resume_in_new_process_is_bit_identical(tmp_path):
    env, networks, config = ppo_setup()
    logs = []
    full = train(
        env,
        networks,
        config,
        log_fn=lambda m, s: logs.append([s, m]),
        checkpoint_fn=ckpt.make_checkpoint_fn(tmp_path / "run", config, keep=None),
    )
    saved_steps = [step_of(p) for p in ckpt.list_checkpoints(tmp_path / "run")]
    assert saved_steps == [0, 64, 128, 192]
    source = tmp_path / "run" / "step_000000064"
    out = tmp_path / "resumed"
    subprocess.run(
        [
            sys.executable,
            "-c",
            _RESUME_SCRIPT.format(tests=str(TESTS)),
            str(source),
            str(out),
        ],
        check=True,
        timeout=600,
        cwd=tmp_path,
        env=cpu_child_env(),
    )
    resumed = ckpt.load_checkpoint(out, like=full.training_state)
    assert_identical(resumed, full.training_state)
    resumed_logs = json.loads((out / "logs.json").read_text())
    # Steps 96..192 were trained after the resume: same losses, rollout
    # statistics and (at 96 and 192) evaluations, to the last bit.
    assert [s for s, _ in resumed_logs] == [96, 128, 160, 192]
    assert resumed_logs == [[s, m] for s, m in logs if s > 64]
    assert "eval/episode_reward/mean" in resumed_logs[0][1]


@pytest.mark.parametrize("reset_mode", ["cached", "initial"])
def test_multi_seed_state_round_trips_and_resumes(tmp_path, reset_mode):
    env, networks, config = ppo_setup(n_seeds=2, reset_mode=reset_mode)
    logs = []
    full = train(
        env,
        networks,
        config,
        log_fn=lambda m, s: logs.append([s, m]),
        checkpoint_fn=ckpt.make_checkpoint_fn(tmp_path, config),
    )
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        "step_000000064",
        "step_000000128",
        "step_000000192",
    ]
    final = ckpt.load_checkpoint(tmp_path, env=env, networks=networks)
    assert_identical(final, full.training_state)
    assert final.key.shape == (2,)
    assert (final.start_states is None) == (reset_mode == "cached")

    resumed_logs = []
    state = ckpt.load_checkpoint(
        tmp_path / "step_000000128", env=env, networks=networks
    )
    resumed = train(
        env,
        networks,
        config,
        initial_state=state,
        log_fn=lambda m, s: resumed_logs.append([s, m]),
    )
    assert_identical(resumed.training_state, full.training_state)
    assert resumed_logs == [[s, m] for s, m in logs if s > 128]


def test_each_step_is_logged_before_it_is_checkpointed():
    # A run killed between the two calls, resumed from that checkpoint, has
    # then logged every step up to it.
    env, networks, config = small_setup()
    config = dataclasses.replace(
        config,
        learner=dataclasses.replace(config.learner, total_steps=24),
        checkpoint_every_steps=8,
    )
    events = []
    train(
        env,
        networks,
        config,
        log_fn=lambda m, s: events.append(("log", s)),
        checkpoint_fn=lambda state, s: events.append(("checkpoint", s)),
    )
    saved = [i for i, (kind, _) in enumerate(events) if kind == "checkpoint"]
    assert [events[i][1] for i in saved] == [0, 8, 16, 24]
    for i in saved:
        assert events[i - 1] == ("log", events[i][1])


def test_distillation_state_resumes_exactly(tmp_path):
    env = eqx_ppo.envs.make("move_to_center")
    teacher = eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=jax.random.key(0))

    def student(key):
        return eqx_ppo.make_lstm_actor_critic(2, 2, 8, key=key)

    config = TrainConfig(
        learner=Distillation(
            teacher,
            n_envs=4,
            rollout_length=8,
            total_steps=4 * ITERATION,
            n_minibatches=2,
            n_epochs=1,
            learning_rate=3e-3,
        ),
        eval=EvalConfig(enabled=False),
        checkpoint_every_steps=2 * ITERATION,
        progress=False,
    )
    full = train(
        env, student, config, checkpoint_fn=ckpt.make_checkpoint_fn(tmp_path, config)
    )
    saved = ckpt.read_header(tmp_path).config
    assert isinstance(saved.learner, Distillation)
    # The header keeps the teacher's fingerprint, enough to refuse another one.
    other = eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=jax.random.key(1))
    with pytest.raises(ckpt.CheckpointError, match=r"learner\.teacher: saved"):
        ckpt.load_checkpoint(
            tmp_path,
            env=env,
            networks=student,
            config=dataclasses.replace(
                config, learner=dataclasses.replace(config.learner, teacher=other)
            ),
        )
    state = ckpt.load_checkpoint(
        tmp_path / "step_000000064", env=env, networks=student, config=config
    )
    resumed = train(env, student, config, initial_state=state)
    assert_identical(resumed.training_state, full.training_state)


def test_config_round_trips_through_json():
    config = TrainConfig(
        learner=PPO(
            learning_rate=3e-4,
            clip_range=0.1,
            gradient_clipping=0.5,
            logging_level=LoggingLevel.ALL,
            logging_percentiles=(5, 50.5),
            lr_schedule="cosine",
        ),
        eval=EvalConfig(logging_level=LoggingLevel.NONE, logging_percentiles=None),
        video=VideoConfig(render_kwargs={"height": 8, "camera": "side"}),
        seed=3,
        n_seeds=2,
        log_every_steps=100,
    )
    data = json.loads(json.dumps(ckpt.config_to_dict(config)))
    back = ckpt.config_from_dict(data)
    assert ckpt.config_to_dict(back) == ckpt.config_to_dict(config)
    assert back.learner.logging_level == LoggingLevel.ALL
    assert back.eval.logging_level == LoggingLevel.NONE
    assert back.learner.logging_percentiles == (5, 50.5)
    # float32 coefficients survive exactly (3e-4 is not a float32 number).
    assert back.learner.learning_rate.dtype == jnp.float32
    assert (
        np.asarray(back.learner.learning_rate).tobytes()
        == np.asarray(config.learner.learning_rate).tobytes()
    )
    teacher = eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=jax.random.key(0))
    distill = TrainConfig(
        learner=Distillation(
            teacher,
            n_envs=8,
            n_minibatches=2,
            learning_rate=1e-3,
            logging_level=LoggingLevel.LOSSES | LoggingLevel.GRAD_NORM,
        )
    )
    assert (
        ckpt.config_from_dict(
            json.loads(json.dumps(ckpt.config_to_dict(distill)))
        ).learner.logging_level
        == LoggingLevel.LOSSES | LoggingLevel.GRAD_NORM
    )
    with pytest.raises(TypeError, match=r"render_kwargs\['size'\]"):
        ckpt.config_to_dict(
            TrainConfig(video=VideoConfig(render_kwargs={"size": {1, 2}}))
        )


def test_round_trip_with_keys_in_env_state(saved, tmp_path):
    path, state = saved
    header = ckpt.read_header(path)
    assert header.step == 7 and header.metadata == {"hidden": [4]}
    assert header.library_version == eqx_ppo.__version__
    key_leaves = [
        leaf for leaf in header.leaves if leaf.get("dtype", "").startswith("key")
    ]
    assert {leaf["path"] for leaf in key_leaves} == {
        ".env_state.pipeline_state",
        ".key",
    }
    assert all(leaf["key_impl"] == "threefry2x32" for leaf in key_leaves)
    env, networks, _ = small_setup()
    assert_identical(ckpt.load_checkpoint(path, env=env, networks=networks), state)
    # A concrete template and a template function give the same state.
    assert_identical(ckpt.load_checkpoint(path, like=state), state)


def test_keep_last_n_latest_and_replacing_a_step(saved, tmp_path):
    _, state = saved
    for step in range(5):
        ckpt.save_checkpoint(tmp_path, state, config=None, step=step, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step_000000003", "step_000000004"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000000004"
    ckpt.save_checkpoint(
        tmp_path, state, config=None, step=4, keep=2, metadata={"again": True}
    )
    assert ckpt.read_header(tmp_path).metadata == {"again": True}
    assert len(ckpt.list_checkpoints(tmp_path)) == 2
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None


def test_truncated_or_corrupted_file_is_refused(saved, tmp_path):
    path, _ = copy(saved, tmp_path)
    env, networks, _ = small_setup()
    data = (path / "state.eqx").read_bytes()
    (path / "state.eqx").write_bytes(data[:-10])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        ckpt.load_checkpoint(path, env=env, networks=networks)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    (path / "state.eqx").write_bytes(bytes(flipped))
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        ckpt.load_checkpoint(path, env=env, networks=networks)
    # A file whose header agrees with it but is not what eqx wrote.
    (path / "state.eqx").write_bytes(b"\0" * len(data))
    zeros = hashlib.sha256(b"\0" * len(data)).hexdigest()
    rewrite_header(path, lambda h: h.update(state_sha256=zeros))
    with pytest.raises(ckpt.CheckpointError, match="could not be read"):
        ckpt.load_checkpoint(path, env=env, networks=networks)


def test_a_checkpoint_without_its_state_file_is_refused(saved, tmp_path):
    path, state = copy(saved, tmp_path)
    (path / "state.eqx").unlink()
    with pytest.raises(
        ckpt.CheckpointError, match=r"has no state\.eqx; it is incomplete"
    ):
        ckpt.load_checkpoint(path, like=state)


def test_wrong_network_structure_names_the_leaves(saved, tmp_path):
    path, _ = copy(saved, tmp_path)
    env, _, _ = small_setup()

    def wider(key):
        return eqx_ppo.make_mlp_actor_critic(2, 2, [5], [4], key=key)

    with pytest.raises(
        ckpt.CheckpointError,
        match=r"(?s)\.network.*kernel: saved float32\[2, 4\], expected "
        r"float32\[2, 5\]",
    ):
        ckpt.load_checkpoint(path, env=env, networks=wider)

    def other_min_std(key):
        return eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=key, min_std=0.5)

    with pytest.raises(ckpt.CheckpointError, match="static structure differs"):
        ckpt.load_checkpoint(path, env=env, networks=other_min_std)

    # A coefficient is a leaf: the saved value wins over the template's.
    def other_entropy(key):
        return eqx_ppo.make_mlp_actor_critic(
            2, 2, [4], [4], key=key, entropy_weight=0.5
        )

    loaded = ckpt.load_checkpoint(path, env=env, networks=other_entropy)
    assert float(loaded.network.layers[1].action.layers[-1].entropy_weight) == float(
        jnp.float32(1e-2)
    )

    def recurrent(key):
        return eqx_ppo.make_lstm_actor_critic(2, 2, 4, key=key)

    with pytest.raises(
        ckpt.CheckpointError, match=r"expected \(absent\)|saved \(absent\)"
    ):
        ckpt.load_checkpoint(path, env=env, networks=recurrent)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda h: h.pop("config"), r"field `config` is missing; it is malformed"),
        (
            lambda h: h["config"]["learner"]["logging_level"]["flags"].append("LOUD"),
            r"config\.learner\.logging_level: unknown LoggingLevel flag 'LOUD'",
        ),
        (
            lambda h: h["config"]["learner"].update(n_envs=0),
            r"config\.learner: the saved PPO is invalid: PPO\(n_envs=0\)",
        ),
        (
            lambda h: h["config"]["learner"].update(n_env=2),
            r"config\.learner: the saved PPO is invalid: .*unexpected keyword "
            r"argument 'n_env'",
        ),
        (
            lambda h: h["config"]["learner"].pop("_type"),
            r"config\.learner: a sub-config saved without its \"_type\"",
        ),
        (
            lambda h: next(s for s in h["leaves"] if "key_impl" in s).update(
                key_impl="threefry"
            ),
            r"field `leaves\[\d+\]` has key_impl='threefry', which is not a PRNG "
            r"implementation this JAX knows",
        ),
        (lambda h: h["leaves"][0].pop("path"), r"field `leaves\[0\]` has path="),
        (
            lambda h: h["leaves"][1].update(dtpye=h["leaves"][1].pop("dtype")),
            r"field `leaves\[1\]` has dtpye=",
        ),
        (
            lambda h: h["leaves"][2].update(shape=["2"]),
            r"field `leaves\[2\]` has shape=\['2'\]",
        ),
        (
            lambda h: h["leaves"].append(7),
            r"field `leaves\[\d+\]` is not an object \(int\)",
        ),
        (lambda h: h.update(leaves={}), r"field `leaves` has the wrong type \(dict\)"),
        (lambda h: h.update(step="7"), r"field `step` has the wrong type \(str\)"),
        (lambda h: h.update(step=True), r"field `step` has the wrong type \(bool\)"),
        (
            lambda h: h.update(metadata=None),
            r"field `metadata` has the wrong type \(NoneType\)",
        ),
        (lambda h: h.pop("state_sha256"), r"field `state_sha256` is missing"),
    ],
    ids=[
        "no-config",
        "unknown-flag",
        "invalid-value",
        "unknown-field",
        "no-type",
        "key-impl",
        "no-path",
        "renamed-dtype",
        "str-shape",
        "int-leaf",
        "dict-leaves",
        "str-step",
        "bool-step",
        "null-metadata",
        "no-state-checksum",
    ],
)
def test_malformed_header_names_the_file_and_field(saved, tmp_path, edit, message):
    # A header with a matching checksum whose fields are not what a save
    # writes (a bug, a hand-made file) is refused by name, never with a bare
    # KeyError or TypeError, by reading it and by loading it.
    path, _ = copy(saved, tmp_path)
    rewrite_header(path, edit)
    for read in (ckpt.read_header, lambda p: ckpt.load_checkpoint(p, like=saved[1])):
        with pytest.raises(ckpt.CheckpointError, match=rf"header\.json: {message}"):
            read(path)


def test_a_header_that_is_not_json_is_refused(saved, tmp_path):
    path, _ = copy(saved, tmp_path)
    (path / "header.json").write_bytes(sealed(b'{\n "step": 7,,'))
    with pytest.raises(ckpt.CheckpointError, match=r"header\.json is not JSON"):
        ckpt.read_header(path)


def _flipped(data, bit):
    flipped = bytearray(data)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


def test_any_change_to_a_header_is_refused(saved, tmp_path):
    path, state = copy(saved, tmp_path)
    header = path / "header.json"
    original = header.read_bytes()
    text = original.decode()
    config = json.loads(text)["config"]
    lr, seed = config["learner"]["learning_rate"], config["seed"]
    edits = {
        "step": text.replace('"step": 7,', '"step": 8,'),
        "a learning-rate digit": text.replace(
            f'"learning_rate": {lr!r}', f'"learning_rate": {lr!r}'[:-1] + "6"
        ),
        "seed": text.replace(f'"seed": {seed},', f'"seed": {seed + 1},'),
        "metadata": text.replace('"hidden": [\n   4\n  ]', '"hidden": [\n   8\n  ]'),
        "an exponent's case": text.replace("e-05", "E-05", 1),
        "indentation": text.replace('\n "step"', '\n  "step"'),
        "truncation": text[: len(text) // 2],
        "a trailing newline": text + "\n",
    }
    rng = np.random.default_rng(0)
    bits = rng.choice(len(original) * 8, size=128, replace=False)
    changed = {name: edit.encode() for name, edit in edits.items()} | {
        f"bit {bit}": _flipped(original, bit) for bit in bits
    }
    assert all(data != original for data in changed.values())
    for name, data in changed.items():
        header.write_bytes(data)
        with pytest.raises(ckpt.CheckpointError, match=r"header\.json") as refused:
            ckpt.load_checkpoint(path, like=state)
        assert str(path) in str(refused.value), name
    header.write_bytes(original)
    assert_identical(ckpt.load_checkpoint(path, like=state), state)


def test_every_single_bit_flip_of_a_header_is_refused(tmp_path):
    # All of them, on a small header, by the checksum alone.
    path = ckpt.save_checkpoint(
        tmp_path, {"x": jnp.ones(2)}, config=None, step=3, metadata={"lr": 1e-05}
    )
    original = (path / "header.json").read_bytes()
    for bit in range(len(original) * 8):
        (path / "header.json").write_bytes(_flipped(original, bit))
        with pytest.raises(ckpt.CheckpointError, match="its own checksum"):
            ckpt.read_header(path)


def test_a_step_folder_holding_another_steps_files_is_refused(saved, tmp_path):
    path, state = copy(saved, tmp_path)
    newer = path.parent / "step_000000009"
    shutil.copytree(path, newer)  # step 7's files where step 9's belong
    message = (
        r"step_000000009 holds the checkpoint of step 7 \(field `step` of its "
        r"header\.json\), not of step 9: its files were copied or renamed from "
        r"another folder\. Fix: load the folder of step 7, or move these files "
        r"to step_000000007\."
    )
    for where in (newer, path.parent):  # by name, and as the latest
        with pytest.raises(ckpt.CheckpointError, match=message):
            ckpt.load_checkpoint(where, like=state)
    # A folder not named after a step may hold any step's files.
    shutil.move(newer, tmp_path / "best")
    assert ckpt.read_header(tmp_path / "best").step == 7


def test_wrong_version_or_missing_header_is_refused(saved, tmp_path):
    path, _ = copy(saved, tmp_path)
    env, networks, _ = small_setup()
    original = (path / "header.json").read_text()
    for change, message in (
        ({"format_version": 99}, "format 99"),
        ({"library_version": "7.0.0"}, "major version"),
    ):
        (path / "header.json").write_text(original)
        rewrite_header(path, lambda h, change=change: h.update(change))
        with pytest.raises(ckpt.CheckpointError, match=message):
            ckpt.load_checkpoint(path, env=env, networks=networks)
    (path / "header.json").write_text(original[: len(original) // 2])
    with pytest.raises(ckpt.CheckpointError, match="does not match its own checksum"):
        ckpt.load_checkpoint(path, env=env, networks=networks)
    (path / "header.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="not a complete checkpoint"):
        ckpt.load_checkpoint(path, env=env, networks=networks)
    with pytest.warns(UserWarning, match=r"has no header\.json.*finds no checkpoint"):
        with pytest.raises(ckpt.CheckpointError, match="No checkpoint"):
            ckpt.load_checkpoint(path.parent, env=env, networks=networks)


def test_no_checkpoint_or_a_non_path_is_refused_by_name(tmp_path):
    env, networks, config = small_setup()
    # The usual pattern on a folder that has no checkpoint yet.
    assert ckpt.latest_checkpoint(tmp_path) is None
    for call in (ckpt.read_header, ckpt.load_checkpoint):
        with pytest.raises(
            ckpt.CheckpointError,
            match=r"No checkpoint given \(path=None; latest_checkpoint\(folder\) "
            r"is None when the folder holds no complete checkpoint\)",
        ):
            call(ckpt.latest_checkpoint(tmp_path))
    state = init_state(env, networks, config)
    # The annotation says it: refused naming the parameter.
    with pytest.raises(TypeError, match=r"(?s)load_checkpoint.*parameter 'path'"):
        ckpt.load_checkpoint(state, env=env, networks=networks)


def test_resume_config_must_not_change_the_optimisation(saved, tmp_path):
    path, state = copy(saved, tmp_path)
    env, networks, config = small_setup()
    ppo = config.learner
    longer = TrainConfig(
        learner=PPO(
            n_envs=2,
            rollout_length=2,
            n_minibatches=1,
            total_steps=ppo.total_steps * 2,
            logging_level=LoggingLevel.ALL,
        )
    )
    assert_identical(
        ckpt.load_checkpoint(path, env=env, networks=networks, config=longer), state
    )
    faster = TrainConfig(
        learner=PPO(
            n_envs=2,
            rollout_length=2,
            n_minibatches=1,
            learning_rate=1e-3,
            gradient_clipping=1.0,
        )
    )
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.load_checkpoint(path, env=env, networks=networks, config=faster)
    lines = str(refused.value).splitlines()
    assert "  learner.gradient_clipping: saved 0.5, given 1.0" in lines
    # Coefficients by their float32 values' shortest repr, as written.
    assert "  learner.learning_rate: saved 0.0001, given 0.001" in lines

    # With a decaying schedule a longer run changes every learning rate.
    def linear(total_steps):
        return TrainConfig(
            learner=PPO(
                n_envs=2,
                rollout_length=2,
                n_minibatches=1,
                lr_schedule="linear",
                total_steps=total_steps,
            )
        )

    assert config_differences(linear(1000), linear(2000)) == [
        "learner.total_steps: saved 1000, given 2000"
    ]


def test_crash_mid_save_keeps_previous_checkpoint(saved, tmp_path, monkeypatch):
    path, state = copy(saved, tmp_path)
    directory = path.parent
    env, networks, config = small_setup()

    write = ckpt._files._write_synced

    def fail(file, data):
        if file.name != "header.json":
            return write(file, data)
        assert (file.parent / "state.eqx").stat().st_size > 0  # partially written
        raise OSError("disk full")

    monkeypatch.setattr(ckpt._files, "_write_synced", fail)
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"step_000000008 failed \(OSError: disk full\).*earlier checkpoint.*"
        r"is intact",
    ):
        ckpt.save_checkpoint(directory, state, config=config, step=8, keep=1)
    monkeypatch.undo()
    assert sorted(p.name for p in directory.iterdir()) == [path.name]
    assert_identical(ckpt.load_checkpoint(directory, env=env, networks=networks), state)


_KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import eqx_ppo.checkpoint as ckpt
from test_checkpoint import small_setup

directory = sys.argv[1]
env, networks, config = small_setup()
state = ckpt.load_checkpoint(directory, env=env, networks=networks)
write = ckpt._files._write_synced
ckpt._files._write_synced = lambda file, data: (  # killed mid-save
    os._exit(3) if file.name == "header.json" else write(file, data)
)
ckpt.save_checkpoint(directory, state, config=config, step=8, keep=1)
"""


def test_process_killed_mid_save_leaves_previous_checkpoint_loadable(saved, tmp_path):
    path, state = copy(saved, tmp_path)
    directory = path.parent
    env, networks, config = small_setup()
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT.format(tests=str(TESTS)), str(directory)],
        timeout=600,
        cwd=tmp_path,
        env=cpu_child_env(),
    )
    assert proc.returncode == 3
    leftovers = [p.name for p in directory.iterdir() if p.name != path.name]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-step_000000008")
    assert ckpt.latest_checkpoint(directory) == path
    assert_identical(ckpt.load_checkpoint(directory, env=env, networks=networks), state)
    # The next save clears the leftover.
    ckpt.save_checkpoint(directory, state, config=config, step=9, keep=1)
    assert sorted(os.listdir(directory)) == ["step_000000009"]


def test_checkpoint_folders_get_the_usual_permissions(saved):
    path, _ = saved
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o777 & ~mask


def test_replacing_a_step_that_fails_keeps_the_old_copy(saved, tmp_path, monkeypatch):
    path, state = copy(saved, tmp_path)
    directory = path.parent
    env, networks, _ = small_setup()
    real_replace = os.replace

    def no_room(src, dst):
        if pathlib.Path(src).name.startswith(".tmp-"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt._files.os, "replace", no_room)
    with pytest.raises(ckpt.CheckpointError, match="earlier checkpoint.*is intact"):
        ckpt.save_checkpoint(
            directory, state, config=None, step=7, metadata={"new": True}
        )
    monkeypatch.undo()
    assert sorted(os.listdir(directory)) == [path.name]
    assert ckpt.read_header(directory).metadata == {"hidden": [4]}
    assert_identical(ckpt.load_checkpoint(directory, env=env, networks=networks), state)


_KILL_WHILE_REPLACING_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import eqx_ppo.checkpoint as ckpt
from test_checkpoint import small_setup

directory, kill_at = sys.argv[1], sys.argv[2]
env, networks, config = small_setup()
state = ckpt.load_checkpoint(directory, env=env, networks=networks)
if kill_at == "between renames":  # the old copy is set aside, the new one not placed
    real_replace = os.replace
    def replace(src, dst):
        if os.path.basename(src).startswith(".tmp-"):
            os._exit(3)
        real_replace(src, dst)
    ckpt._files.os.replace = replace
else:  # while the old copy is being deleted, the new one in place
    ckpt._files.shutil.rmtree = lambda path, **kwargs: os._exit(3)
ckpt.save_checkpoint(directory, state, config=config, step=7, metadata={{"new": True}})
"""


@pytest.mark.parametrize("kill_at", ["between renames", "while deleting"])
def test_process_killed_while_replacing_a_step_loses_neither_copy(
    saved, tmp_path, kill_at
):
    path, state = copy(saved, tmp_path)
    directory = path.parent
    env, networks, config = small_setup()
    script = _KILL_WHILE_REPLACING_SCRIPT.format(tests=str(TESTS))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(directory), kill_at],
        timeout=600,
        cwd=tmp_path,
        env=cpu_child_env(),
    )
    assert proc.returncode == 3
    leftovers = sorted(p.name for p in directory.iterdir() if p.name != path.name)
    assert [name.split("-")[0] for name in leftovers] == (
        [".replaced", ".tmp"] if kill_at == "between renames" else [".replaced"]
    )
    # Before any save puts it back, loading finds the step where it was set
    # aside, by its folder's name or as the latest.
    expected = {"hidden": [4]} if kill_at == "between renames" else {"new": True}
    for where in (directory, path):
        assert ckpt.read_header(where).metadata == expected
    assert ckpt.read_header(ckpt.latest_checkpoint(directory)).step == 7
    assert_identical(ckpt.load_checkpoint(directory, env=env, networks=networks), state)
    # The next save puts the set-aside copy back if its successor never
    # arrived, and removes the leftovers.
    ckpt.save_checkpoint(directory, state, config=config, step=9)
    assert sorted(os.listdir(directory)) == [path.name, "step_000000009"]
    assert ckpt.read_header(path).metadata == expected
    assert_identical(ckpt.load_checkpoint(path, env=env, networks=networks), state)


def test_a_later_step_folder_without_a_header_is_passed_over_with_a_warning(
    saved, tmp_path
):
    path, state = copy(saved, tmp_path)
    damaged = path.parent / "step_000000009"
    shutil.copytree(path, damaged)
    (damaged / "header.json").unlink()
    message = (
        r"step_000000009 has no header\.json, so loading passes over it and "
        r"finds step_000000007\. No save leaves such a folder"
    )
    with pytest.warns(UserWarning, match=message):
        assert ckpt.latest_checkpoint(path.parent) == path
    env, networks, _ = small_setup()
    with pytest.warns(UserWarning, match=message):
        loaded = ckpt.load_checkpoint(path.parent, env=env, networks=networks)
    assert_identical(loaded, state)


def test_retention_never_deletes_the_new_checkpoint_or_later_ones(saved, tmp_path):
    _, state = saved
    ckpt.save_checkpoint(tmp_path, state, config=None, step=1000, keep=1)
    for step in (500, 600):
        with pytest.warns(UserWarning, match=r"after step \d+: \['step_000001000'\]"):
            path = ckpt.save_checkpoint(tmp_path, state, config=None, step=step, keep=1)
        assert path.is_dir()
        assert sorted(os.listdir(tmp_path)) == [path.name, "step_000001000"]


def test_a_folder_that_cannot_be_written_gives_a_checkpoint_error(saved, tmp_path):
    _, state = saved
    (tmp_path / "file").write_text("not a folder")
    for directory in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(
            ckpt.CheckpointError, match=r"Saving .*step_000000001 failed"
        ):
            ckpt.save_checkpoint(directory, state, config=None, step=1)
    assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("delete_before", ["header", "state"])
def test_a_checkpoint_deleted_while_loading_says_so(
    saved, tmp_path, monkeypatch, delete_before
):
    path, _ = copy(saved, tmp_path)
    env, networks, _ = small_setup()
    patched = {"header": "resolve", "state": "check_structure"}[delete_before]
    original = getattr(ckpt, patched)

    def then_delete(*args):
        out = original(*args)
        shutil.rmtree(path)  # a running save's `keep=` rotated it away
        return out

    monkeypatch.setattr(ckpt, patched, then_delete)
    with pytest.raises(ckpt.CheckpointError, match="deleted while it was being read"):
        ckpt.load_checkpoint(path.parent, env=env, networks=networks)


class _Holder:
    """Not a pytree: JAX sees one leaf, which holds arrays."""

    def __init__(self, state):
        self.state = state


def test_a_state_hiding_arrays_from_the_serialiser_is_refused(saved, tmp_path):
    _, state = saved
    result = eqx_ppo.TrainResult(state, {}, [], 0, 0)
    for bad, where, kind in (
        (result, "the state", "TrainResult"),
        ({"run": _Holder(state)}, r"leaf \['run'\]", "_Holder"),
    ):
        with pytest.raises(
            TypeError,
            match=rf"save_checkpoint\(state=\.\.\.\): {where} is a {kind}, which "
            r"holds arrays but is not a pytree, so they would not be saved\. Fix: "
            r"save the pytree inside it \(for a TrainResult, result\.training_state\)",
        ):
            ckpt.save_checkpoint(tmp_path, bad, config=None, step=1)
    assert os.listdir(tmp_path) == []
    # Leaves that hold no arrays (a str, a function) are restored from the
    # template, as before.
    ckpt.save_checkpoint(tmp_path, {"a": jnp.ones(2), "name": "x"}, config=None, step=2)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"keep": 0}, ValueError, r"keep=0\): must be >= 1\. Fix: "),
        # Wrong types: the annotations say them.
        ({"keep": 2.5}, TypeError, r"parameter 'keep'"),
        ({"keep": "3"}, TypeError, r"parameter 'keep'"),
        ({"step": -1}, ValueError, r"save_checkpoint\(step=-1\): .* >= 0"),
        ({"step": 2.7}, TypeError, r"parameter 'step'"),
        ({"step": jnp.float32(2.7)}, TypeError, r"parameter 'step'"),
        (
            {"metadata": {"n": np.int64(3)}},
            TypeError,
            r"save_checkpoint\(metadata=...\): .*int64.*int\(x\)",
        ),
    ],
)
def test_bad_save_arguments_are_refused_before_writing(
    saved, tmp_path, kwargs, error, message
):
    _, state = saved
    with pytest.raises(error, match=message):
        ckpt.save_checkpoint(tmp_path, state, **{"config": None, "step": 1, **kwargs})
    assert os.listdir(tmp_path) == []
    if "keep" in kwargs:
        with pytest.raises(error, match=message):
            ckpt.make_checkpoint_fn(tmp_path, None, keep=kwargs["keep"])


def test_a_config_dict_with_a_type_key_is_refused_at_save(saved, tmp_path):
    _, state = saved
    _, _, config = small_setup()
    config = dataclasses.replace(
        config, video=VideoConfig(render_kwargs={"_type": "rgb"})
    )
    with pytest.raises(
        TypeError, match=r"TrainConfig.video.render_kwargs has a key \"_type\""
    ):
        ckpt.save_checkpoint(tmp_path, state, config=config, step=1)
    assert os.listdir(tmp_path) == []


def test_a_state_holding_nan_is_never_saved(saved, tmp_path):
    _, state = saved
    poisoned = jax.tree.map(
        lambda x: x.at[0].set(jnp.nan) if eqx.is_inexact_array(x) and x.ndim else x,
        state,
    )
    with pytest.raises(FloatingPointError, match=r"holds NaN or inf.*never written"):
        ckpt.save_checkpoint(tmp_path, poisoned, config=None, step=1)
    assert ckpt.latest_checkpoint(tmp_path) is None
