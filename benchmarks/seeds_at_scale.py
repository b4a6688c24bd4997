"""Thousands of seeds on one device: CartPole-v1, every seed in one program.

    python -m benchmarks.seeds_at_scale [--seeds 2048] [--steps 500000] [--quick]

Trains `--seeds` seeds of gymnax's `CartPole-v1` (through eqx_ppo's gymnax
adapter; `--env cartpole` for the built-in continuous-force version) for
`--steps` env steps each with `TrainConfig(n_seeds=...)`: one compiled
program trains all of them. Reports the wall time of the training call,
compilation included (and of the whole worker process, from its start to
the trained state: opening the device and imports too), and the share of
seeds whose final deterministic evaluation (one episode on each of 32 envs,
mean return) reaches 475 of the 500 possible (gym's "solved" level for
CartPole-v1).

The settings are PureJaxRL's CartPole PPO (4 envs x 128 steps per seed and
iteration, 4 epochs, 4 minibatches, learning rate 2.5e-4 annealed linearly
to 0, discount 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value weight
0.5, gradient clipping 0.5, 64x64 tanh actor and critic, no observation
normalisation) but for one: advantages are not normalised per minibatch.
Once a seed balances the pole to the time limit, normalisation scales the
critic's noise up to unit advantages and some converged seeds drift away
(the FAQ's "Why did my run collapse?"). eqx_ppo's minibatches are whole env
sequences where PureJaxRL shuffles single transitions. benchmarks/README.md
gives the CPU runs that chose these settings.

Also the largest seed count that fits in the device's memory, estimated
from XLA's memory account of one compiled chunk at two seed counts (memory
is linear in the seed count: fixed + per seed), never by filling the device.

The parent never imports JAX; the worker (this module with `--worker`)
prints each result as it has it. Written to `results/seeds_at_scale.*`
(prefixed with the backend on an accelerator).
"""

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

from ._common import (
    first_device,
    hardware,
    machine,
    publish,
    run_session,
    serve_session,
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run: env, seeds, steps per seed and PureJaxRL's PPO settings."""

    env: str = "gymnax:CartPole-v1"
    n_seeds: int = 2048
    steps: int = 500_000
    n_envs: int = 4
    rollout_length: int = 128
    n_epochs: int = 4
    n_minibatches: int = 4
    learning_rate: float = 2.5e-4
    lr_schedule: str = "linear"
    discount: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    entropy_weight: float = 0.01
    critic_loss_weight: float = 0.5
    gradient_clipping: float = 0.5
    normalize_advantages: bool = False
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    chunks: int = 10
    eval_envs: int = 32
    episode_length: int = 500
    seed: int = 0
    threshold: float = 475.0


QUICK = {"n_seeds": 4, "steps": 4 * 16 * 4, "rollout_length": 16, "chunks": 2}
"""`--quick`: 4 seeds, 4 iterations of 4 envs x 16 steps (a check of the script)."""


def memory_points(n_seeds: int) -> tuple[int, int]:
    """The two seed counts whose compiled chunk's memory is measured."""
    return max(1, n_seeds // 8), max(2, n_seeds // 2)


def items(settings: Settings) -> list[dict[str, Any]]:
    s = dataclasses.asdict(settings)
    return [{"kind": "train", "settings": s}] + [
        {"kind": "memory", "settings": s, "n_seeds": n}
        for n in memory_points(settings.n_seeds)
    ]


def _run_item(item: dict[str, Any]) -> dict[str, Any]:
    from . import _worker

    if item["kind"] == "train":
        return _worker.train_seeds(item["settings"])
    return _worker.seeds_memory(item["settings"], item["n_seeds"])


def fit_memory(points: list[dict[str, Any]]) -> dict[str, Any]:
    """`peak = fixed + per_seed * seeds` through the two measured points, and
    the largest seed count whose peak fits in the device's memory."""
    a, b = sorted(points, key=lambda p: p["n_seeds"])[:2]
    per_seed = (b["peak_bytes"] - a["peak_bytes"]) / (b["n_seeds"] - a["n_seeds"])
    fixed = a["peak_bytes"] - per_seed * a["n_seeds"]
    limit = b.get("device_bytes")
    fits = None
    if limit and per_seed > 0:
        fits = int((limit - fixed) // per_seed)
    return {
        "per_seed_bytes": per_seed,
        "fixed_bytes": fixed,
        "device_bytes": limit,
        "device_bytes_source": b.get("device_bytes_source"),
        "max_seeds": fits,
    }


def run(
    settings: Settings, *, deadline: float | None = None, log=print
) -> dict[str, Any]:
    work = items(settings)
    start = time.perf_counter()
    arrived: dict[int, float] = {}

    def on_result(i: int, result: dict[str, Any]) -> None:
        arrived[i] = time.perf_counter() - start
        if "error" in result:
            log(f"  {work[i]['kind']}: ERROR {result['error'][-400:]}")
        elif work[i]["kind"] == "train":
            returns = result["final_returns"]
            solved = sum(r >= settings.threshold for r in returns)
            log(
                f"  trained {len(returns)} seeds in {result['train_wall_s']:.1f} s "
                f"(process {arrived[i]:.1f} s); {solved} reach "
                f"{settings.threshold:g}"
            )
        else:
            log(
                f"  {result['n_seeds']} seeds: one chunk needs "
                f"{_size(result['peak_bytes'])}"
            )

    results = run_session(
        work,
        command=[sys.executable, "-m", "benchmarks.seeds_at_scale", "--worker"],
        deadline=deadline,
        on_result=on_result,
    )
    train, *memory = results
    out: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "device": first_device(results),
        "train": train,
        "memory": memory,
    }
    if "error" not in train:
        returns = train["final_returns"]
        out["solved"] = sum(r >= settings.threshold for r in returns)
        out["solved_share"] = out["solved"] / len(returns)
        out["process_to_trained_s"] = arrived[0]
        out["returns_summary"] = {
            "min": min(returns),
            "p10": sorted(returns)[len(returns) // 10],
            "median": statistics.median(returns),
        }
    good = [m for m in memory if "error" not in m]
    if len(good) == 2:
        out["memory_fit"] = fit_memory(good)
    return out


def markdown(result: dict[str, Any]) -> str:
    s, m, train = result["settings"], result["machine"], result["train"]
    lines = [
        f"### {s['n_seeds']:,} seeds of `{s['env']}` in one program",
        "",
        f"{s['steps']:,} env steps per seed; per seed {s['n_envs']} envs x "
        f"{s['rollout_length']} steps per iteration, {s['n_epochs']} epochs, "
        f"{s['n_minibatches']} minibatches, lr {s['learning_rate']:g} "
        f"({s['lr_schedule']}), discount {s['discount']:g}, GAE lambda "
        f"{s['gae_lambda']:g}, clip {s['clip_range']:g}, entropy "
        f"{s['entropy_weight']:g}, value weight {s['critic_loss_weight']:g}, "
        f"gradient clipping {s['gradient_clipping']:g}, advantages "
        f"{'' if s['normalize_advantages'] else 'not '}normalised, "
        f"{'x'.join(map(str, s['hidden']))} {s['activation']} MLPs; the run in "
        f"{s['chunks']} compiled chunks. Final evaluation: deterministic, one "
        f"episode on each of {s['eval_envs']} envs per seed. JAX {m['jax']} on "
        f"{hardware(m)}.",
        "",
    ]
    if "error" in train:
        lines.append(f"Training failed: {train['error'][-500:]}")
    else:
        r = result["returns_summary"]
        lines += [
            "| wall time, training call incl. compile (s) | worker process to "
            "trained state (s) | final evaluation (s) | seeds >= "
            f"{s['threshold']:g} | final return min / p10 / median |",
            "|---|---|---|---|---|",
            f"| {train['train_wall_s']:.1f} | {result['process_to_trained_s']:.1f} "
            f"| {train['eval_wall_s']:.1f} | {result['solved']:,} / "
            f"{s['n_seeds']:,} ({100 * result['solved_share']:.1f}%) "
            f"| {r['min']:.0f} / {r['p10']:.0f} / {r['median']:.0f} |",
        ]
    fit = result.get("memory_fit")
    if fit:
        points = ", ".join(
            f"{p['n_seeds']:,} seeds {_size(p['peak_bytes'])}" for p in result["memory"]
        )
        limit = fit["device_bytes"]
        most = fit["max_seeds"]
        lines += [
            "",
            f"Memory of one compiled chunk (XLA's account: arguments + outputs - "
            f"donated + scratch): {points}; so {_size(fit['fixed_bytes'])} + "
            f"{_size(fit['per_seed_bytes'])} per seed. "
            + (
                f"The device holds {limit / 2**30:.1f} GiB "
                f"({fit['device_bytes_source']}): at most about **{most:,} seeds** "
                "fit (an estimate; the allocator needs some room of its own)."
                if limit and most is not None
                else "The device's memory size is unknown here."
            ),
        ]
    return "\n".join(lines) + "\n"


def _size(n_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes:,.0f} B"


def estimate_s(settings: Settings, backend: str) -> float:
    """A rough duration: opening the device and imports, three compilations,
    the training and the evaluation (throughput guessed per backend)."""
    if backend == "cpu":
        rate, compile_s = 60_000.0, 15.0
    else:
        rate, compile_s = 20e6, 35.0
    steps = settings.n_seeds * settings.steps
    return 25.0 + 3 * compile_s + steps / rate + 10.0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        serve_session(argv[1], _run_item)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="default 2048")
    parser.add_argument(
        "--steps", type=int, default=None, help="per seed, default 500000"
    )
    parser.add_argument(
        "--env",
        default="gymnax:CartPole-v1",
        choices=["gymnax:CartPole-v1", "cartpole"],
    )
    parser.add_argument("--quick", action="store_true", help="a tiny check run")
    parser.add_argument("--name", default="seeds_at_scale", help="results file stem")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.seeds is not None:
        overrides["n_seeds"] = args.seeds
    if args.steps is not None:
        overrides["steps"] = args.steps
    settings = Settings(env=args.env, **overrides)
    started = machine()
    print(
        f"seeds_at_scale: {settings.n_seeds} seeds x {settings.steps:,} steps of "
        f"{settings.env}",
        flush=True,
    )
    result = run(settings)
    publish(args.name, result, markdown, started)


if __name__ == "__main__":
    main()
