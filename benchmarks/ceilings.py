"""Throughput ceilings of eqx_ppo's pieces on this machine.

`python -m benchmarks.ceilings '<Spec json>'` (run by `compare`) times, each as
its own compiled program, with compile time excluded:

- `env_only`: `rollout_length` steps of `n_envs` envs with random actions: the
  env's own speed, the upper bound of any trainer.
- `rollout`: eqx_ppo's rollout (network forward, sampling, auto-reset).
- `update`: `step` on a fixed rollout: the `n_epochs * n_minibatches`
  gradient steps (loss replay, GAE, Adam) and the statistics update.
- `step`: one whole iteration (rollout + update + statistics), one
  compiled call per iteration.

All are reported as env-steps per second of training, i.e. `n_envs *
rollout_length` divided by the time of one call, so they compare directly
with the training throughput: `1/step ~ 1/rollout + 1/update`.
The update swaps `eqx_ppo.ppo._step.run_episodes` for the fixed rollout while
`step` is traced, so it always times the engine's current update code.
"""

import sys
import time
from typing import Any

from ._common import Spec, emit, eqx_env, peak_rss_mb


def compile_and_time(
    fn, *args, repeats: int = 5, inner: int = 5
) -> tuple[Any, dict[str, float]]:
    """Compile the jitted `fn` for `args`; return the compiled function and its
    compile seconds and median wall and CPU milliseconds per call.

    CPU time counts every thread of this process; on a machine shared with
    other work it moves much less than wall time.
    """
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    return compiled, {
        "compile_s": compile_s,
        **time_calls(compiled, *args, repeats=repeats, inner=inner),
    }


def time_calls(compiled, *args, repeats: int = 5, inner: int = 5) -> dict[str, float]:
    """Median wall and CPU milliseconds per call of an already compiled
    function, after one warm-up call."""
    import jax

    jax.block_until_ready(compiled(*args))
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(inner):
            out = compiled(*args)
        jax.block_until_ready(out)
        wall.append((time.perf_counter() - t0) / inner)
        cpu.append((time.process_time() - c0) / inner)
    return {
        "ms": sorted(wall)[repeats // 2] * 1e3,
        "cpu_ms": sorted(cpu)[repeats // 2] * 1e3,
    }


def rollout_step(env, config):
    """`state -> (carry, data)`: eqx_ppo's rollout from a training state, as
    `step` runs it."""
    from eqx_ppo.ppo._rollout import StepCarry, run_episodes
    from eqx_ppo.ppo._step import rollout_save

    def collect(state):
        return run_episodes(
            env,
            state.network,
            StepCarry(state.env_state, state.carry),
            state.key,
            length=config.rollout_length,
            reset=config.reset_mode,
            save=rollout_save(config),
        )

    return collect


def update_step(env, config):
    """`(state, carry, data) -> step(...)` with the rollout replaced by the
    given `(carry, data)`: exactly the engine's update (and statistics step),
    however it changes."""
    from eqx_ppo.ppo import _step

    def update(state, carry, data):
        real = _step.run_episodes
        _step.run_episodes = lambda *args, **kwargs: (carry, data)
        try:
            return _step.step(env, config, state)
        finally:
            _step.run_episodes = real

    return update


def measure(spec: Spec) -> dict[str, Any]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqx_ppo
    from eqx_ppo.nn import trainable
    from eqx_ppo.ppo._step import step

    from ._worker import eqx_config, eqx_network

    env = eqx_env(spec.env)
    config = eqx_config(spec).learner
    network = eqx_network(spec, env, jax.random.key(spec.seed))
    state = eqx.filter_jit(eqx_ppo.init)(
        env, network, config, key=jax.random.key(spec.seed + 1)
    )
    steps = spec.n_envs * spec.rollout_length
    out: dict[str, Any] = {}

    def record(name, fn, *args):
        _, timing = compile_and_time(fn, *args)
        out[name] = {"sps": steps / timing["ms"] * 1e3, **timing}

    @jax.jit
    def env_only(env_state, key):
        def step(s, k):
            actions = jax.random.uniform(
                k, (spec.n_envs, env.action_size), minval=-1.0, maxval=1.0
            )
            s = jax.vmap(env.step)(s, actions)
            return s, s.reward

        return jax.lax.scan(step, env_state, jax.random.split(key, spec.rollout_length))

    record("env_only", env_only, state.env_state, jax.random.key(0))

    rollout_only = eqx.filter_jit(rollout_step(env, config))
    record("rollout", rollout_only, state)
    carry, data = rollout_only(state)

    record("update", eqx.filter_jit(update_step(env, config)), state, carry, data)

    one_step = eqx.filter_jit(lambda s: step(env, config, s))
    record("step", one_step, state)
    out["n_params"] = int(
        sum(
            jnp.size(x)
            for x in jax.tree.leaves(
                eqx.filter(state.network, trainable(state.network))
            )
        )
    )
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> None:
    spec = Spec.from_json(sys.argv[1])
    emit(measure(spec))


if __name__ == "__main__":
    main()
