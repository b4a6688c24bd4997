"""How step time and peak memory grow with `n_envs` and `rollout_length`, and
whether a long eqx_ppo run keeps its memory flat.

    python -m benchmarks.scaling                      # eqx_ppo, brax, nnx
    python -m benchmarks.scaling --systems eqx --env inverted_pendulum
    python -m benchmarks.scaling --flat-only

Each point is a short training run in a fresh process: `n_envs` in
{64, 256, 1024} at rollout 20, and `rollout_length` in {10, 20, 40, 80} at
256 envs. Reported per point: the steady time of one iteration (rollout +
update of `n_envs * rollout_length` steps), the env-steps/s and the peak RSS.

The flatness check trains eqx_ppo for many iterations and samples the
process's RSS at every chunk boundary: per-iteration metrics leave the device
once per chunk and are dropped, so RSS must not grow with the iteration count.
Written to `benchmarks/results/scaling.*`.
"""

import argparse
import sys
from typing import Any

from ._common import (
    SYSTEM_NAMES,
    Boundaries,
    Spec,
    current_rss_mb,
    emit,
    eqx_env,
    first_device,
    machine,
    peak_rss_mb,
    publish,
    run_worker,
)

N_ENVS = (64, 256, 1024)
ROLLOUTS = (10, 20, 40, 80)


def flat(spec: Spec) -> dict[str, Any]:
    """Worker: one long eqx_ppo run, RSS sampled at every chunk boundary."""
    import eqx_ppo

    from ._worker import eqx_config, eqx_network

    env = eqx_env(spec.env)
    timer = Boundaries(spec)
    samples: list[tuple[int, float]] = []

    def log_fn(metrics, step):
        timer.mark(step)
        if step % spec.chunk_steps == 0:
            samples.append((step // spec.steps_per_iteration, current_rss_mb()))

    eqx_ppo.train_ppo(
        env,
        lambda key: eqx_network(spec, env, key),
        eqx_config(spec),
        log_fn=log_fn,
    )
    out = timer.summary()
    out["rss_by_iteration"] = samples
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def point(system: str, env: str, n_envs: int, rollout: int, iters: int) -> dict:
    spec = Spec(
        system=system,
        env=env,
        n_envs=n_envs,
        rollout_length=rollout,
        total_steps=iters * n_envs * rollout,
        n_chunks=3,
        evaluate=False,
    )
    out = run_worker("benchmarks._worker", spec)
    out.update(system=system, n_envs=n_envs, rollout_length=rollout)
    if "error" not in out:
        out["iteration_ms"] = n_envs * rollout / out["sps"] * 1e3
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("{"):  # worker: a Spec as JSON
        emit(flat(Spec.from_json(argv[0])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        default="move_to_center",
        choices=["inverted_pendulum", "move_to_center"],
    )
    parser.add_argument("--systems", default="eqx,brax,nnx")
    parser.add_argument(
        "--iters", type=int, default=6, help="iterations per point (3 chunks)"
    )
    parser.add_argument("--flat-iters", type=int, default=2000)
    parser.add_argument("--flat-only", action="store_true")
    parser.add_argument("--no-flat", action="store_true")
    parser.add_argument("--name", default="scaling", help="results file stem")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    started = machine()

    grid = [(n, 20) for n in N_ENVS] + [(256, r) for r in ROLLOUTS if r != 20]
    points: list[dict[str, Any]] = []
    if not args.flat_only:
        for n_envs, rollout in grid:
            for system in systems:
                out = point(system, args.env, n_envs, rollout, args.iters)
                points.append(out)
                if "error" in out:
                    print(f"  {system} n_envs={n_envs} T={rollout}: ERROR")
                else:
                    print(
                        f"  {system:4s} n_envs={n_envs:5d} T={rollout:3d}: "
                        f"{out['iteration_ms']:8.1f} ms/iter "
                        f"{out['sps']:9.0f} steps/s rss {out['peak_rss_mb']:6.0f} MiB"
                    )
    flatness = None
    if not args.no_flat:
        spec = Spec(
            system="eqx",
            env=args.env,
            n_envs=64,
            rollout_length=10,
            total_steps=args.flat_iters * 640,
            n_chunks=20,
            evaluate=False,
        )
        flatness = run_worker("benchmarks.scaling", spec, timeout=1800)
        if "error" not in flatness:
            rss = [r for _, r in flatness["rss_by_iteration"]]
            print(
                f"  flat: {args.flat_iters} iterations, RSS {rss[0]:.0f} -> "
                f"{rss[-1]:.0f} MiB (max {max(rss):.0f})"
            )
    result = {
        "env": args.env,
        "systems": systems,
        "points": points,
        "flatness": flatness,
        "device": first_device([*points, flatness or {}]),
    }
    publish(args.name, result, markdown, started)


def markdown(result: dict[str, Any]) -> str:
    systems, points = result["systems"], result["points"]
    lines = [
        f"### Scaling on `{result['env']}` (4x32 swish MLP, 8 minibatches, 4 epochs)"
    ]
    if points:
        header = " | ".join(f"{SYSTEM_NAMES[s]} ms/iter (MiB)" for s in systems)
        lines += [
            "",
            "Steady time of one iteration (rollout + update), and peak RSS of the "
            "training process.",
            "",
            f"| n_envs | rollout | env steps / iter | {header} |",
            "|---|---|---|" + "---|" * len(systems),
        ]
        keys = sorted(
            {(p["n_envs"], p["rollout_length"]) for p in points},
            key=lambda k: (k[1] != 20, k[0], k[1]),
        )
        for n_envs, rollout in keys:
            cells = []
            for s in systems:
                p = [
                    q
                    for q in points
                    if q["system"] == s
                    and q["n_envs"] == n_envs
                    and q["rollout_length"] == rollout
                ]
                if not p or "error" in p[0]:
                    cells.append("failed")
                else:
                    cells.append(
                        f"{p[0]['iteration_ms']:.1f} ({p[0]['peak_rss_mb']:.0f})"
                    )
            lines.append(
                f"| {n_envs} | {rollout} | {n_envs * rollout:,} | {' | '.join(cells)} |"
            )
    f = result.get("flatness")
    if f and "error" not in f:
        samples = f["rss_by_iteration"]
        rss = [r for _, r in samples]
        picks = [samples[0], samples[len(samples) // 2], samples[-1]]
        lines += [
            "",
            f"Memory flatness (eqx_ppo, 64 envs x 10 steps, {samples[-1][0]:,} "
            "iterations): RSS at iteration "
            + ", ".join(f"{it:,}: {r:.0f} MiB" for it, r in picks)
            + f"; max {max(rss):.0f} MiB, growth from the first boundary to the "
            f"last {rss[-1] - rss[0]:+.1f} MiB.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
