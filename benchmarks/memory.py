"""Memory models: how fast each recurrent cell replays, and how well it learns.

    python -m benchmarks.memory [--part replay|learning|all] [--quick]

Two parts, each written to its own results:

- `replay` (`results/memory_replay.*`): for each cell of
  `make_recurrent_actor_critic` (`lstm`, `gru`, and `lru`, `mingru` on both
  replay paths, the sequential scan and the associative scan, and once more
  with the recurrence itself removed, a floor for any replay of that cell;
  the LRU also with twice its default complex states, one per unit,
  `lru@64`; and a feed-forward MLP) at hidden size 64, the time of one PPO
  minibatch loss + gradient on a minibatch of 32 envs x `T` steps, `T` in
  16, 64, 256. The minibatch is a real rollout of the untrained network on
  `repeat_previous` (16-step episodes, so a `T = 256` sequence holds 16
  episode resets), taken as one whole minibatch. The timed program is
  `jax.jit` of 16 updates in a `lax.scan`, each `eqx.filter_value_and_grad`
  of `PPO(...).loss` and a small SGD step (so no update repeats the last),
  compiled once (ahead of time) per cell and `T`; we report its time per
  update. Sixteen updates in one program are what one `step` runs with
  `PPO`'s default 4 epochs x 4 minibatches. Timing one gradient per
  call would also time the allocation of the program's scratch memory: glibc
  hands blocks over 32 MiB back to the OS when freed, so every call page-faults
  its buffers in again, which cost the LSTM at `T = 256` 27 ms of system time
  per 51 ms call on our 2-core machine, and the cells under 32 MiB nothing.
  Training pays that once per `step`, not per minibatch. After a warm-up
  call, every round
  times each (cell, `T`) once, in an order rotated per round, so machine noise
  hits all alike; we report the median over rounds and its ratio to the LSTM
  of the same round. Peak memory is XLA's own account of the compiled
  program (`compile().memory_analysis()`): `temp` is the scratch buffers its
  buffer assignment allocates (every intermediate, including what the
  forward pass saves for the backward one), not counting the arguments and
  outputs, which are listed apart; it is the program's static allocation, not
  a measured RSS.
- `learning` (`results/memory_learning.*`): each cell, and the MLP, trained
  on the built-in memory tasks with `TrainConfig(n_seeds=4)` (four seeds in
  one vmapped program; `--seeds` for more), evaluated deterministically at
  step 0, about 20 points along the run and its end: the final eval return
  over seeds (median and worst) and the env steps at which the
  median-over-seeds curve first reaches 90% of the optimum.

`--quick` runs a tiny version of both (the smoke test's).
"""

import argparse
import dataclasses
import math
import statistics
import time
from typing import Any

from ._common import cores, hardware, machine, publish, versions

CELLS = ("lstm", "gru", "lru", "mingru")
NETWORKS = (*CELLS, "mlp")
# The replay part times both replay paths of the linear recurrences.
REPLAY_NETWORKS = (
    "lstm",
    "gru",
    "lru:scan",
    "lru:parallel",
    "mingru:scan",
    "mingru:parallel",
    "lru:floor",
    "mingru:floor",
    "lru@64",
    "mlp",
)
REPLAY_ENV = "repeat_previous"


def _log(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------- networks


def make_network(
    kind: str,
    env: Any,
    key: Any,
    hidden: int,
    mlp_layers: tuple[int, ...],
    entropy_weight: float = 1e-2,
):
    """`kind` is a cell name (`make_recurrent_actor_critic`) or `"mlp"`; a
    linear recurrence may name its replay path, `"lru:scan"` or
    `"lru:parallel"` (`parallel_replay=False` / `True`; plain `"lru"` lets the
    layer pick by backend), and the LRU its number of complex states,
    `"lru@64"` (`lru_state_size=64`; default `hidden / 2`).

    Discrete envs (`n_actions`) get categorical samplers, as `eqx_ppo.cli`
    builds them. A recurrent network is the cell of width `hidden` in each
    port, then `mlp_layers`; the MLP is `(hidden, hidden)` hidden layers
    (the feed-forward reference).
    """
    import eqx_ppo

    n_actions = getattr(env, "n_actions", None)
    discrete = n_actions is not None
    actions = n_actions if discrete else env.action_size
    if kind == "mlp":
        return eqx_ppo.make_mlp_actor_critic(
            env.observation_size,
            actions,
            (hidden, hidden),
            (hidden, hidden),
            key=key,
            discrete=discrete,
            entropy_weight=entropy_weight,
        )
    cell, states, path = _parse_kind(kind)
    if path not in ("", "scan", "parallel", "floor"):
        raise ValueError(f"{kind!r}: the replay path is 'scan', 'parallel' or 'floor'")
    network = eqx_ppo.nn.make_recurrent_actor_critic(
        env.observation_size,
        actions,
        hidden,
        key=key,
        cell=cell,
        parallel_replay={"": None, "scan": False, "parallel": True, "floor": None}[
            path
        ],
        actor_hidden_sizes=mlp_layers,
        critic_hidden_sizes=mlp_layers,
        discrete=discrete,
        entropy_weight=entropy_weight,
        lru_state_size=int(states) if states else None,
    )
    if path == "floor":
        network = _without_recurrence(network)
    return network


def _without_recurrence(network):
    """`network` with each LRU / MinGRU replaying its projections but no recurrence.

    A timing floor, not a model: the replay computes every matmul and gate of
    the cell over the whole sequence, then skips the scan (the state is just
    the step's own input term). What any replay of the cell must cost at least.
    """
    import jax
    import jax.numpy as jnp

    from eqx_ppo import nn
    from eqx_ppo.nn import SequenceOutput

    class NoRecurrence(nn.AbstractStatefulModule):
        cell: nn.LRU | nn.MinGRU

        def initial_state(self):
            return self.cell.initial_state()

        def __call__(self, state, x, extras=None, *, key=None):
            return self.cell(state, x, extras, key=key)

        def replay(self, state0, xs, extras, keys, done):
            # All T x M steps in one batch, merged as the cells' own replay does.
            steps = xs.reshape(-1, xs.shape[-1])
            _, drive = self.cell._coefficients(steps)
            output = self.cell._output(drive, steps)
            return SequenceOutput(
                state0,
                output.reshape(*done.shape, -1),
                jnp.zeros(done.shape, jnp.float32),
            )

    def swap(node):
        return NoRecurrence(node) if isinstance(node, (nn.LRU, nn.MinGRU)) else node

    return jax.tree.map(
        swap, network, is_leaf=lambda node: isinstance(node, (nn.LRU, nn.MinGRU))
    )


# --------------------------------------------------------------------- replay


UPDATES_PER_CALL = 16
"""Gradient updates per timed call: `PPO`'s default `n_epochs *
n_minibatches`, the updates one `step` runs inside one compiled program."""


def _replay_program(
    kind: str,
    length: int,
    n_envs: int,
    hidden: int,
    seed: int = 0,
    updates: int = UPDATES_PER_CALL,
):
    """A compiled run of `updates` minibatch loss + gradient + SGD updates, its
    arguments and its compile time.

    The updates run in one program, as `step` runs its epochs and
    minibatches, so the program's scratch memory is allocated once per call,
    not once per gradient (see the module docstring).
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqx_ppo
    from eqx_ppo import envs
    from eqx_ppo.nn import trainable
    from eqx_ppo.ppo._learner import Minibatch
    from eqx_ppo.ppo._rollout import StepCarry, run_episodes
    from eqx_ppo.ppo._step import rollout_save

    env = envs.make(REPLAY_ENV)
    key = jax.random.key(seed)
    net_key, init_key, rollout_key = jax.random.split(key, 3)
    network = make_network(kind, env, net_key, hidden, ())
    config = eqx_ppo.PPO(n_envs=n_envs, rollout_length=length, n_minibatches=1)
    state = eqx_ppo.init(env, network, config, key=init_key)

    @eqx.filter_jit
    def collect(state):
        return run_episodes(
            env,
            state.network,
            StepCarry(state.env_state, state.carry),
            rollout_key,
            length=length,
            reset=config.reset_mode,
            save=rollout_save(config),
        )

    last, steps = collect(state)
    data = steps.transitions
    # The whole rollout as one minibatch, as `step` slices it: the carries
    # at the rollout's start, the [T, M] transitions, the final observations.
    minibatch = Minibatch(state.carry, data, last.env_state.obs)
    learner = config
    params, static = eqx.partition(state.network, trainable(state.network))

    def loss(p, batch):
        return learner.loss(eqx.combine(p, static), batch)

    value_and_grad = eqx.filter_value_and_grad(loss, has_aux=True)

    def run(p, batch):
        # Each update changes the parameters, so no gradient is loop-invariant.
        def update(p, _):
            (value, _), grads = value_and_grad(p, batch)
            return jax.tree.map(lambda w, g: w - 1e-4 * g, p, grads), value

        return jax.lax.scan(update, p, length=updates)

    t0 = time.perf_counter()
    compiled = jax.jit(run).lower(params, minibatch).compile()
    compile_s = time.perf_counter() - t0
    final, values = compiled(params, minibatch)
    finite = bool(jnp.all(jnp.isfinite(values))) and all(
        bool(jnp.all(jnp.isfinite(w))) for w in jax.tree.leaves(final)
    )
    memory = compiled.memory_analysis()
    return compiled, (params, minibatch), compile_s, memory, finite, float(values[0])


def _parse_kind(kind: str) -> tuple[str, str, str]:
    """`"cell@states:path"` as `(cell, states, path)`, absent parts `""`."""
    cell_and_states, _, path = kind.partition(":")
    cell, _, states = cell_and_states.partition("@")
    return cell, states, path


def _replay_path(kind: str, length: int) -> str:
    """How `kind` replays a sequence of `length` steps in the loss, on this
    backend (a linear recurrence's default path may depend on `length`)."""
    from eqx_ppo.nn._recurrence import replay_method

    cell, _, path = _parse_kind(kind)
    if cell == "mlp":
        return "one batched call (no carry)"
    if cell in ("lstm", "gru"):
        return "scan"
    if path == "floor":
        return "projections only, no recurrence (a floor)"
    parallel = {"": None, "scan": False, "parallel": True}[path]
    method = replay_method(parallel, pairs=cell == "lru", n_steps=length)
    return {"associative": "associative scan", "blocked": "blocked scan"}.get(
        method, "scan"
    )


def _label(kind: str) -> str:
    """A table label: the cell and, for a linear recurrence, the path forced."""

    cell, states, path = _parse_kind(kind)
    if cell == "mlp":
        return "mlp (no memory, floor)"
    if states:
        cell = f"{cell}, {states} complex states"
    if not path:
        return cell
    if path == "floor":
        return f"{cell}, no recurrence (floor)"
    return f"{cell}, {'associative scan' if path == 'parallel' else 'scan'}"


def _time_once(fn, args, number: int, updates: int = 1) -> float:
    """Seconds per update, over `number` calls of `updates` updates each."""
    import jax

    t0 = time.perf_counter()
    for _ in range(number):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / (number * updates)


def run_replay(
    lengths: tuple[int, ...],
    kinds: tuple[str, ...],
    *,
    n_envs: int,
    hidden: int,
    rounds: int,
    min_sample_s: float,
    updates: int = UPDATES_PER_CALL,
    log=None,
) -> dict[str, Any]:
    log = log or _log
    programs = {}
    rows = []
    for length in lengths:
        for kind in kinds:
            fn, args, compile_s, memory, finite, value = _replay_program(
                kind, length, n_envs, hidden, updates=updates
            )
            first = _time_once(fn, args, 1)  # warm-up; the whole call
            number = max(1, math.ceil(min_sample_s / max(first, 1e-6)))
            programs[kind, length] = (fn, args, number)
            rows.append(
                {
                    "network": kind,
                    "replay_path": _replay_path(kind, length),
                    "T": length,
                    "compile_s": compile_s,
                    "calls_per_sample": number,
                    "temp_bytes": memory.temp_size_in_bytes,
                    "argument_bytes": memory.argument_size_in_bytes,
                    "output_bytes": memory.output_size_in_bytes,
                    "generated_code_bytes": memory.generated_code_size_in_bytes,
                    "loss_finite": finite,
                    "loss": value,
                    "samples_ms": [],
                }
            )
            log(
                f"  compiled {kind:15s} T={length:3d} in {compile_s:5.1f} s, "
                f"first call {first * 1e3:7.1f} ms, temp "
                f"{memory.temp_size_in_bytes / 2**20:6.1f} MiB"
            )
    by_key = {(r["network"], r["T"]): r for r in rows}
    order = list(programs)
    for rnd in range(rounds):
        shift = rnd % len(order)
        for key in order[shift:] + order[:shift]:
            fn, args, number = programs[key]
            by_key[key]["samples_ms"].append(
                _time_once(fn, args, number, updates) * 1e3
            )
        log(f"  round {rnd + 1}/{rounds} done")
    for r in rows:
        r["median_ms"] = statistics.median(r["samples_ms"])
        lstm = by_key.get(("lstm", r["T"]))
        if lstm is not None:
            # Paired per round: the ratio of this network's sample to the LSTM's.
            ratios = [
                lstm_ms / ms
                for lstm_ms, ms in zip(lstm["samples_ms"], r["samples_ms"], strict=True)
            ]
            r["speedup_vs_lstm"] = statistics.median(ratios)
            r["speedup_vs_lstm_samples"] = ratios
    return {
        "env": REPLAY_ENV,
        "n_envs": n_envs,
        "hidden": hidden,
        "lengths": list(lengths),
        "rounds": rounds,
        "min_sample_s": min_sample_s,
        "updates_per_call": updates,
        "rows": rows,
    }


def replay_markdown(result: dict[str, Any]) -> str:
    rows, lengths = result["rows"], result["lengths"]
    by_key = {(r["network"], r["T"]): r for r in rows}
    kinds = list(dict.fromkeys(r["network"] for r in rows))
    m = result["machine"]
    load = m.get("load_avg_at_start")
    load_text = f", load average at start {load[0]:.1f}" if load else ""
    lines = [
        f"### Replay speed: one minibatch PPO loss + gradient "
        f"({result['n_envs']} envs x T steps, hidden {result['hidden']})",
        "",
        f"`{result['env']}` rollout of the untrained network as one minibatch; "
        f"time per update of `jax.jit` of {result['updates_per_call']} updates "
        "in a `lax.scan` (`eqx.filter_value_and_grad(PPO.loss)` and an SGD step "
        "each, as one `step` runs its epochs x minibatches), median of "
        f"{result['rounds']} rounds (cells alternated within each round); speed-up "
        f"= LSTM time / cell time, paired per round, median. JAX "
        f"{m['jax']} on {hardware(m)} ({m['backend']}{load_text}).",
        "",
        "| network | " + " | ".join(f"T = {t}: ms (speed-up)" for t in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]

    def table(cell) -> list[str]:
        """One row per network, `cell(row)` per length (`n/a` where unmeasured)."""
        return [
            f"| {_label(kind)} | "
            + " | ".join(
                "n/a" if (kind, t) not in by_key else cell(by_key[kind, t])
                for t in lengths
            )
            + " |"
            for kind in kinds
        ]

    def speed(r) -> str:
        ratio = r.get("speedup_vs_lstm")
        return f"{r['median_ms']:.1f}" + ("" if ratio is None else f" ({ratio:.2f}x)")

    def memory(r) -> str:
        io = (r["argument_bytes"] + r["output_bytes"]) / 2**20
        return f"{r['temp_bytes'] / 2**20:.1f} ({io:.2f}), {r['compile_s']:.1f}"

    lines += table(speed)
    defaults = [
        f"{r['network']} at T = {r['T']}: {r['replay_path']}"
        for r in rows
        if r["network"] in ("lru", "mingru")
    ]
    if defaults:
        lines += ["", f"The layers' default paths here: {'; '.join(defaults)}."]
    lines += [
        "",
        "Peak memory of the compiled updates (XLA `memory_analysis()`: "
        "temp = scratch buffers, activations saved for the backward pass "
        "included; arguments and outputs apart), MiB; compile time in s:",
        "",
        "| network | "
        + " | ".join(f"T = {t}: temp MiB (args + out), compile s" for t in lengths)
        + " |",
        "|---|" + "---|" * len(lengths),
    ]
    lines += table(memory)
    bad = [f"{r['network']} T={r['T']}" for r in rows if not r["loss_finite"]]
    if bad:
        lines += ["", f"Non-finite loss or gradient: {', '.join(bad)}."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------- learning


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in memory env, its optimum and its best memoryless return."""

    name: str
    episode_length: int
    optimum: float
    memoryless: str
    total_steps: int
    reward_scaling: float = 1.0


TASKS = {
    # Budgets (env steps per seed) from pilot runs on this machine: several
    # times what the fastest cell needed, where the slower ones still climbed
    # at half of it; the whole part fits in ~40 min on 2 cores.
    "repeat_previous": Task("repeat_previous", 16, 1.0, "-0.5", 409_600),
    "repeat_first": Task("repeat_first", 16, 1.0, "-0.406", 409_600),
    "count_recall": Task("count_recall", 16, 1.0, "-0.207", 1_024_000),
    "recall": Task("recall", 5, 5.0, "1", 51_200),
    "cartpole_no_velocity": Task(
        "cartpole_no_velocity", 500, 500.0, "far below (random about 26)", 512_000
    ),
}
DEFAULT_TASKS = tuple(TASKS)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The PPO settings every (network, task) run of the learning part uses."""

    hidden: int = 64
    mlp_layers: tuple[int, ...] = (64,)
    n_seeds: int = 4
    n_envs: int = 64
    rollout_length: int = 16
    n_minibatches: int = 4
    n_epochs: int = 4
    learning_rate: float = 1e-3
    discounting_factor: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    entropy_weight: float = 1e-2
    gradient_clipping: float = 0.5
    evals: int = 20
    eval_envs: int = 64
    seed: int = 0


def run_learning_one(
    kind: str, task: Task, settings: Settings, total_steps: int
) -> dict[str, Any]:
    import jax
    import numpy as np

    import eqx_ppo
    from eqx_ppo import envs

    env = envs.make(task.name)
    per_iteration = settings.n_envs * settings.rollout_length
    iterations = max(1, -(-total_steps // per_iteration))
    every = max(1, -(-iterations // settings.evals)) * per_iteration
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=settings.n_envs,
            rollout_length=settings.rollout_length,
            total_steps=iterations * per_iteration,
            n_minibatches=settings.n_minibatches,
            n_epochs=settings.n_epochs,
            learning_rate=settings.learning_rate,
            discounting_factor=settings.discounting_factor,
            gae_lambda=settings.gae_lambda,
            clip_range=settings.clip_range,
            gradient_clipping=settings.gradient_clipping,
            reward_scaling=task.reward_scaling,
        ),
        eval=eqx_ppo.EvalConfig(
            every_steps=every,
            n_envs=settings.eval_envs,
            max_episode_length=task.episode_length,
            logging_percentiles=None,
        ),
        seed=settings.seed,
        n_seeds=settings.n_seeds,
        log_every_steps=every,
        progress=False,
    )

    def networks(key):
        return make_network(
            kind,
            env,
            key,
            settings.hidden,
            settings.mlp_layers,
            settings.entropy_weight,
        )

    t0 = time.perf_counter()
    try:
        result = eqx_ppo.train(env, networks, config)
    except FloatingPointError as error:
        return {
            "network": kind,
            "task": task.name,
            "error": f"FloatingPointError: {error}",
            "wall_s": time.perf_counter() - t0,
        }
    wall = time.perf_counter() - t0
    jax.block_until_ready(result.training_state.steps)
    steps = [int(r["step"]) for r in result.eval_history]
    returns = np.array(
        [
            np.atleast_1d(np.asarray(r["eval/episode_reward/mean"], np.float64))
            for r in result.eval_history
        ]
    )  # [eval, seed]
    median_curve = np.median(returns, axis=1)
    target = 0.9 * task.optimum
    hit = np.nonzero(median_curve >= target)[0]
    per_seed_hit = [
        steps[int(np.nonzero(curve >= target)[0][0])]
        if np.any(curve >= target)
        else None
        for curve in returns.T
    ]
    final = returns[-1]
    return {
        "network": kind,
        "task": task.name,
        "total_steps": int(steps[-1]) if steps else 0,
        "eval_steps": steps,
        "curves": returns.T.tolist(),  # [seed][eval]
        "median_curve": median_curve.tolist(),
        "final_median": float(np.median(final)),
        "final_worst": float(np.min(final)),
        "final_best": float(np.max(final)),
        "target": target,
        "steps_to_target": int(steps[int(hit[0])]) if hit.size else None,
        "steps_to_target_per_seed": per_seed_hit,
        "wall_s": wall,
        "env_steps_per_s": config.n_seeds * iterations * per_iteration / wall,
        "ppo_config": _config_dict(config.learner),
        "eval_config": {
            k: v if isinstance(v, (int, float, bool, type(None))) else str(v)
            for k, v in dataclasses.asdict(config.eval).items()
        },
    }


def _config_dict(config: Any) -> dict[str, Any]:
    """Every setting of a learner (`PPO`), arrays as floats, enums as strings."""
    import numpy as np

    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if hasattr(value, "shape"):
            value = float(np.asarray(value))
        elif not isinstance(value, (int, float, str, bool, type(None))):
            value = str(value)
        out[field.name] = value
    return out


def run_learning(
    kinds: tuple[str, ...],
    tasks: list[Task],
    settings: Settings,
    *,
    steps_override: int | None = None,
    log=None,
) -> dict[str, Any]:
    log = log or _log
    runs = []
    for task in tasks:
        total = steps_override or task.total_steps
        for kind in kinds:
            out = run_learning_one(kind, task, settings, total)
            runs.append(out)
            if "error" in out:
                log(f"  {task.name:22s} {kind:6s}: ERROR {out['error'][:300]}")
                continue
            reach = out["steps_to_target"]
            log(
                f"  {task.name:22s} {kind:6s}: final median "
                f"{out['final_median']:7.3f} worst {out['final_worst']:7.3f}, "
                f"90% at {reach if reach is not None else 'not reached'}, "
                f"{out['wall_s']:5.0f} s"
            )
    return {
        "settings": dataclasses.asdict(settings),
        "tasks": {t.name: dataclasses.asdict(t) for t in tasks},
        "steps_override": steps_override,
        "runs": runs,
    }


def _fmt_return(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.0f}"


def learning_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    tasks = result["tasks"]
    runs = result["runs"]
    kinds = list(dict.fromkeys(r["network"] for r in runs))
    m = result["machine"]
    lines = [
        "### Learning on the built-in memory tasks",
        "",
        f"{s['n_seeds']} seeds in one vmapped program per (network, task); "
        f"{s['n_envs']} envs x rollout {s['rollout_length']}, "
        f"{s['n_minibatches']} minibatches, {s['n_epochs']} epochs, lr "
        f"{s['learning_rate']:g}, discount {s['discounting_factor']:g}, GAE lambda "
        f"{s['gae_lambda']:g}, clip {s['clip_range']:g}, entropy "
        f"{s['entropy_weight']:g}, gradient clipping {s['gradient_clipping']:g}, "
        f"obs normalisation. Recurrent: the cell (hidden {s['hidden']}) in each "
        f"port, then {list(s['mlp_layers'])} swish; mlp: "
        f"[{s['hidden']}, {s['hidden']}] swish. Deterministic eval on "
        f"{s['eval_envs']} envs at {s['evals']} points. Each cell: final eval "
        "return median / worst over seeds; env steps (per seed) at which the "
        "median curve first reached 90% of the optimum. JAX "
        f"{m['jax']} on {cores(m)}.",
        "",
        "| task (steps, optimum, memoryless) | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for name, task in tasks.items():
        cells = []
        steps = None
        for kind in kinds:
            r = next(
                (x for x in runs if x["task"] == name and x["network"] == kind), None
            )
            if r is None:
                cells.append("n/a")
                continue
            if "error" in r:
                cells.append("error")
                continue
            steps = r["total_steps"]
            reach = r["steps_to_target"]
            reach_text = (
                "not reached" if reach is None else f"90% at {reach / 1e3:.0f}k"
            )
            cells.append(
                f"{_fmt_return(r['final_median'])} / {_fmt_return(r['final_worst'])}, "
                f"{reach_text}"
            )
        header = (
            f"`{name}` ({steps / 1e3:.0f}k, {task['optimum']:g}, {task['memoryless']})"
            if steps
            else f"`{name}`"
        )
        lines.append(f"| {header} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Wall time per run (s, compilation included; {s['n_seeds']} seeds):",
        "",
        "| task | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for name in tasks:
        cells = []
        for kind in kinds:
            r = next(
                (x for x in runs if x["task"] == name and x["network"] == kind), None
            )
            cells.append("n/a" if r is None else f"{r['wall_s']:.0f}")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    errors = [r for r in runs if "error" in r]
    if errors:
        lines.append("")
        for r in errors:
            lines.append(f"- `{r['task']}` {r['network']}: {r['error'][:300]}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["replay", "learning", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument(
        "--tasks",
        default=None,
        help=f"default {','.join(DEFAULT_TASKS)} (recall with --quick); any of "
        + ", ".join(TASKS),
    )
    parser.add_argument(
        "--networks",
        default=None,
        help=f"default {','.join(REPLAY_NETWORKS)} for the replay, "
        f"{','.join(NETWORKS)} for the learning (with --quick: lstm,mlp and mlp); "
        "'lru:scan' / 'lru:parallel' force a replay path",
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per task")
    parser.add_argument(
        "--seeds", type=int, default=Settings.n_seeds, help="seeds per learning run"
    )
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--name", default="memory", help="results file prefix")
    args = parser.parse_args(argv)
    if args.networks:
        replay_kinds = learning_kinds = tuple(args.networks.split(","))
    elif args.quick:  # the smoke test's: two replays, one training run
        replay_kinds, learning_kinds = ("lstm", "mlp"), ("mlp",)
    else:
        replay_kinds, learning_kinds = REPLAY_NETWORKS, NETWORKS
    task_names = args.tasks or ("recall" if args.quick else ",".join(DEFAULT_TASKS))
    t_start = time.perf_counter()
    if args.part in ("replay", "all"):
        started, at_start = machine(), versions()
        t0 = time.perf_counter()
        if args.quick:
            result = run_replay(
                (4,),
                replay_kinds,
                n_envs=2,
                hidden=4,
                rounds=2,
                min_sample_s=0.0,
                updates=2,
            )
        else:
            result = run_replay(
                (16, 64, 256),
                replay_kinds,
                n_envs=32,
                hidden=64,
                rounds=args.rounds,
                min_sample_s=0.1,
            )
        # `publish` reads the versions when the part ends; the code that ran is
        # the checkout's when it began.
        result.update(wall_s=time.perf_counter() - t0, versions_at_start=at_start)
        publish(f"{args.name}_replay", result, replay_markdown, started)
    if args.part in ("learning", "all"):
        started, at_start = machine(), versions()
        t0 = time.perf_counter()
        tasks = [TASKS[name] for name in task_names.split(",")]
        if args.quick:
            settings = Settings(
                hidden=4,
                mlp_layers=(),
                n_seeds=2,
                n_envs=2,
                rollout_length=4,
                n_minibatches=1,
                n_epochs=1,
                evals=2,
                eval_envs=2,
            )
            result = run_learning(learning_kinds, tasks, settings, steps_override=16)
        else:
            result = run_learning(
                learning_kinds,
                tasks,
                Settings(n_seeds=args.seeds),
                steps_override=args.steps,
            )
        result.update(wall_s=time.perf_counter() - t0, versions_at_start=at_start)
        publish(f"{args.name}_learning", result, learning_markdown, started)
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
