"""eqx_ppo against Brax PPO, rejax and nnx-ppo 0.3.0: same env, same hyperparameters.

    python -m benchmarks.compare --env inverted_pendulum --steps 1024000 --reps 3
    python -m benchmarks.compare --env move_to_center --policy lstm
    python -m benchmarks.compare --systems eqx,base --baseline ../old-checkout

`--baseline` names another checkout of eqx_ppo (e.g. a `git worktree` of the
commit before a change); the `base` system trains with its `eqx_ppo`, so a
change is A/B-measured in one run, paired per repetition like the peers.

Each repetition trains every system once, each in a fresh process, in an order
rotated per repetition (so no system always runs first or last on a loaded
machine). Throughput ratios are *paired*: eqx_ppo's run divided by the other
system's run of the same repetition, then the median over repetitions.

Printed and written to `benchmarks/results/compare_<env>_<policy>.{json,md}`.
"""

import argparse
import dataclasses
import os
import pathlib
from typing import Any

from ._common import (
    BASELINE_ENV,
    SYSTEM_NAMES,
    Spec,
    first_device,
    hardware,
    machine,
    publish,
    run_worker,
    spread,
)


def run(
    base: Spec,
    systems: list[str],
    reps: int,
    *,
    ceilings: bool,
    log=print,
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
        for system in order:
            spec = dataclasses.replace(base, system=system, seed=rep)
            out = run_worker("benchmarks._worker", spec)
            out.update(rep=rep, system=system)
            runs.append(out)
            if "error" in out:
                log(f"  rep {rep} {system}: ERROR {out['error'][-400:]}")
            else:
                log(
                    f"  rep {rep} {system:4s}: {out['sps']:9.0f} steps/s  "
                    f"compile {out['compile_s']:5.1f}s  "
                    f"rss {out['peak_rss_mb']:6.0f} MiB  "
                    f"return {out.get('eval_return', float('nan')):8.2f}"
                )
    result: dict[str, Any] = {
        "spec": dataclasses.asdict(base),
        "systems": systems,
        "reps": reps,
        "runs": runs,
    }
    if ceilings:
        result["ceilings"] = run_worker(
            "benchmarks.ceilings", dataclasses.replace(base)
        )
    result["summary"] = summarise(runs, systems)
    result["device"] = first_device([*runs, result.get("ceilings", {})])
    return result


def _ok(runs, system):
    return [r for r in runs if r["system"] == system and "error" not in r]


def summarise(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in systems:
        ok = _ok(runs, system)
        summary[system] = {
            key: [r[key] for r in ok]
            for key in (
                "sps",
                "compile_s",
                "peak_rss_mb",
                "eval_return",
                "train_wall_s",
            )
            if all(key in r for r in ok)
        }
    ratios = {}
    for other in systems:
        if other == "eqx" or "eqx" not in systems:
            continue
        paired = []
        for rep in sorted({r["rep"] for r in runs}):
            mine = [r for r in _ok(runs, "eqx") if r["rep"] == rep]
            theirs = [r for r in _ok(runs, other) if r["rep"] == rep]
            if mine and theirs:
                paired.append(mine[0]["sps"] / theirs[0]["sps"])
        ratios[other] = paired
    summary["eqx_over"] = ratios
    return summary


def markdown(result: dict[str, Any]) -> str:
    spec, summary = result["spec"], result["summary"]
    net = (
        f"{len(spec['hidden'])}x{spec['hidden'][0]} swish MLP"
        if spec["policy"] == "mlp"
        else f"LSTM({spec['lstm_size']}) + {len(spec['hidden'])}x"
        f"{spec['hidden'][0] if spec['hidden'] else 0} swish MLP"
    )
    lines = [
        f"### `{spec['env']}`, {spec['policy']} policy",
        "",
        f"{spec['n_envs']} envs, rollout {spec['rollout_length']}, "
        f"{spec['n_minibatches']} minibatches, {spec['n_epochs']} epochs, {net} "
        f"actor and critic, obs normalisation, {_steps(spec):,} "
        f"steps, {result['reps']} repetitions; median [min-max]. "
        f"JAX {result['versions']['jax']} on {hardware(result['machine'])} "
        f"(load average at start {_load(result)}).",
        "",
        "| system | steady env-steps/s | compile + first chunk overhead (s) "
        "| peak RSS (MiB) | final deterministic return |",
        "|---|---|---|---|---|",
    ]
    for system in result["systems"]:
        s = summary[system]
        if not s.get("sps"):
            lines.append(f"| {SYSTEM_NAMES[system]} | failed | | | |")
            continue
        lines.append(
            f"| {SYSTEM_NAMES[system]} | {spread(s['sps'])} | {spread(s['compile_s'])} "
            f"| {spread(s['peak_rss_mb'])} | {spread(s.get('eval_return', []))} |"
        )
    lines.append("")
    for other, paired in summary["eqx_over"].items():
        lines.append(
            f"- paired throughput ratio eqx_ppo / {SYSTEM_NAMES[other]}: "
            f"**{spread(paired)}** (per repetition: "
            f"{', '.join(f'{p:.2f}' for p in paired)})"
        )
    ceilings = result.get("ceilings")
    if ceilings and "error" not in ceilings:
        lines += [
            "",
            "Ceilings for eqx_ppo (each piece compiled alone, in env-steps/s of "
            "training):",
            "",
            "| env only | rollout only | update only | one `step` call |",
            "|---|---|---|---|",
            "| "
            + " | ".join(
                f"{ceilings[k]['sps']:,.0f} ({ceilings[k]['ms']:.1f} ms)"
                for k in ("env_only", "rollout", "update", "step")
            )
            + " |",
        ]
    return "\n".join(lines) + "\n"


def _steps(spec: dict[str, Any]) -> int:
    return Spec(**{**spec, "hidden": tuple(spec["hidden"])}).run_steps


def _load(result: dict[str, Any]) -> str:
    load = result["machine"].get("load_avg_at_start")
    return "n/a" if not load else f"{load[0]:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        default="inverted_pendulum",
        choices=["inverted_pendulum", "move_to_center", "cartpole", "cartpole_balance"],
        help="cartpole is the built-in pure-JAX cart-pole; cartpole_balance is "
        "MuJoCo Playground's CartpoleBalance (MJX)",
    )
    parser.add_argument("--policy", default="mlp", choices=["mlp", "lstm"])
    parser.add_argument(
        "--systems", default=None, help="comma list of eqx,base,brax,rejax,nnx"
    )
    parser.add_argument(
        "--baseline", default=None, help="checkout of eqx_ppo for the `base` system"
    )
    parser.add_argument("--steps", type=int, default=1_024_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument("--rollout-length", type=int, default=20)
    parser.add_argument("--minibatches", type=int, default=Spec.n_minibatches)
    parser.add_argument(
        "--hidden",
        default=None,
        help="hidden sizes, e.g. 256,256,256,256 (default 4x32 MLP, 2x32 LSTM)",
    )
    parser.add_argument("--no-ceilings", action="store_true")
    parser.add_argument("--name", default=None, help="results file stem")
    args = parser.parse_args(argv)

    if args.systems:
        systems = args.systems.split(",")
        if "base" in systems:
            if args.baseline is None:
                parser.error("--systems base needs --baseline PATH")
            os.environ[BASELINE_ENV] = str(pathlib.Path(args.baseline).resolve())
    else:
        systems = (
            ["eqx", "brax", "rejax", "nnx"] if args.policy == "mlp" else ["eqx", "nnx"]
        )
    base = Spec(
        env=args.env,
        policy=args.policy,
        n_envs=args.n_envs,
        rollout_length=args.rollout_length,
        n_minibatches=args.minibatches,
        total_steps=args.steps,
        n_chunks=args.chunks,
        hidden=tuple(int(h) for h in args.hidden.split(","))
        if args.hidden
        else (32, 32, 32, 32)
        if args.policy == "mlp"
        else (32, 32),
    )
    print(f"compare: {args.env}, {args.policy}, systems {systems}, {args.reps} reps")
    started = machine()
    result = run(base, systems, args.reps, ceilings=not args.no_ceilings)
    name = args.name or f"compare_{args.env}_{args.policy}"
    publish(name, result, markdown, started)


if __name__ == "__main__":
    main()
