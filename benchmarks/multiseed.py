"""Multi-seed training: S seeds in one vmapped program vs one big run vs S runs.

    python -m benchmarks.multiseed --seeds 16 --envs-per-seed 64 --reps 2

Three ways to spend the same env steps, each in a fresh process:

- `vmapped`: `TrainConfig(n_seeds=S)` with `n_envs` per seed; one program.
- `single`: one run with `S * n_envs` envs (the throughput to match).
- `sequential`: S separate `train_ppo` calls of `n_envs` envs, one after the
  other in one process (the compiled program is reused after the first).

Steady-state throughput counts the env steps of all seeds; `end-to-end` is
every env step divided by the wall time from the first call to the last
result, compilation included. Written to `benchmarks/results/multiseed.*`.
"""

import argparse
import dataclasses
import sys
import time
from typing import Any

from ._common import (
    Spec,
    emit,
    first_device,
    machine,
    median,
    peak_rss_mb,
    publish,
    run_worker,
    spread,
)


def sequential(spec: Spec, n_runs: int) -> dict[str, Any]:
    """Worker: `n_runs` single-seed runs back to back in this process."""
    from ._common import eqx_env
    from ._worker import run_eqx

    env = eqx_env(spec.env)  # one env object: later runs reuse the compiled chunk
    t0 = time.perf_counter()
    runs = [
        run_eqx(dataclasses.replace(spec, seed=spec.seed + i, n_seeds=1), env)
        for i in range(n_runs)
    ]
    wall = time.perf_counter() - t0
    steps = sum(r["steps"] for r in runs)
    # Every run after the first reuses the compiled chunk; its whole wall time
    # (chunk boundaries, host syncs, init) is what a loop over seeds costs.
    later = runs[1:] or runs
    return {
        "sps": median([r["sps"] for r in later]),
        "end_to_end_sps": steps / wall,
        "wall_s": wall,
        "steps": steps,
        "compile_s": runs[0]["compile_s"],
        "run_wall_s": [r["train_wall_s"] for r in runs],
        "peak_rss_mb": peak_rss_mb(),
    }


def one(spec: Spec) -> dict[str, Any]:
    out = run_worker("benchmarks._worker", spec)
    if "error" not in out:
        out["end_to_end_sps"] = out["steps"] / out["train_wall_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("{"):  # worker: a Spec as JSON, the run count
        emit(sequential(Spec.from_json(argv[0]), int(argv[1])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        default="inverted_pendulum",
        choices=["inverted_pendulum", "move_to_center"],
    )
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--envs-per-seed", type=int, default=64)
    parser.add_argument("--steps-per-seed", type=int, default=64_000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument("--name", default="multiseed", help="results file stem")
    args = parser.parse_args(argv)

    s, n = args.seeds, args.envs_per_seed
    per_seed = Spec(
        system="eqx",
        env=args.env,
        n_envs=n,
        total_steps=args.steps_per_seed,
        n_chunks=args.chunks,
        evaluate=False,
    )
    variants = {
        "vmapped": dataclasses.replace(per_seed, n_seeds=s),
        "single": dataclasses.replace(
            per_seed, n_envs=s * n, total_steps=s * per_seed.run_steps
        ),
    }
    print(f"multiseed: {s} seeds x {n} envs vs {s * n} envs, {args.env}")
    started = machine()
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        names = list(variants) + ([] if args.no_sequential else ["sequential"])
        names = names[rep % len(names) :] + names[: rep % len(names)]
        for name in names:
            if name == "sequential":
                out = run_worker(
                    "benchmarks.multiseed",
                    per_seed,
                    extra=[str(s)],
                    timeout=1800,
                )
            else:
                out = one(variants[name])
            out.update(rep=rep, variant=name)
            runs.append(out)
            if "error" in out:
                print(f"  rep {rep} {name}: ERROR {out['error'][-300:]}")
            else:
                print(
                    f"  rep {rep} {name:10s}: steady {out['sps']:9.0f} steps/s, "
                    f"end-to-end {out['end_to_end_sps']:9.0f} steps/s, "
                    f"compile {out['compile_s']:5.1f}s, "
                    f"rss {out['peak_rss_mb']:6.0f} MiB"
                )
    result = {
        "seeds": s,
        "envs_per_seed": n,
        "spec": dataclasses.asdict(per_seed),
        "runs": runs,
        "device": first_device(runs),
    }
    publish(args.name, result, markdown, started)


def _paired(runs, a: str, b: str, key: str) -> list[float]:
    out = []
    for rep in sorted({r["rep"] for r in runs}):
        x = [
            r
            for r in runs
            if r["rep"] == rep and r["variant"] == a and "error" not in r
        ]
        y = [
            r
            for r in runs
            if r["rep"] == rep and r["variant"] == b and "error" not in r
        ]
        if x and y:
            out.append(x[0][key] / y[0][key])
    return out


def markdown(result: dict[str, Any]) -> str:
    s, n, runs = result["seeds"], result["envs_per_seed"], result["runs"]
    spec = result["spec"]
    lines = [
        f"### Multi-seed: {s} seeds x {n} envs, `{spec['env']}`",
        "",
        f"Rollout {spec['rollout_length']}, {spec['n_minibatches']} minibatches, "
        f"{spec['n_epochs']} epochs, 4x32 swish MLP; "
        f"{Spec(**{**spec, 'hidden': tuple(spec['hidden'])}).run_steps:,} steps per "
        f"seed; median [min-max] over repetitions. Throughput counts all seeds.",
        "",
        "| variant | steady env-steps/s | end-to-end env-steps/s | compile (s) "
        "| peak RSS (MiB) |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "vmapped": f"{s} seeds x {n} envs, one vmapped program",
        "single": f"1 seed x {s * n} envs",
        "sequential": f"{s} sequential runs x {n} envs",
    }
    for name, label in labels.items():
        ok = [r for r in runs if r["variant"] == name and "error" not in r]
        if not ok:
            continue
        lines.append(
            f"| {label} | {spread([r['sps'] for r in ok])} "
            f"| {spread([r['end_to_end_sps'] for r in ok])} "
            f"| {spread([r['compile_s'] for r in ok])} "
            f"| {spread([r['peak_rss_mb'] for r in ok])} |"
        )
    lines.append("")
    for a, b, what in (
        ("vmapped", "single", "vmapped / single big run (target >= 0.90)"),
        ("vmapped", "sequential", "vmapped / sequential runs (speed-up)"),
    ):
        steady = _paired(runs, a, b, "sps")
        e2e = _paired(runs, a, b, "end_to_end_sps")
        if steady:
            lines.append(
                f"- {what}: steady **{spread(steady)}**, end-to-end {spread(e2e)}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
