"""Learning quality against Brax PPO at the same settings, with eqx_ppo A/B variants.

    python -m benchmarks.quality --env cartpole --seeds 5 --reward-scaling 10 \
        --variants brax,brax_max_grad_norm_0.5,default,no_clip

Trains every system (and every eqx_ppo variant) on `--seeds` seeds, each run in
its own process, at the benchmark setting of `benchmarks._common.Spec` (256
envs x 20 steps, 8 minibatches, 4 epochs, lr 3e-4, 4x32 swish, 1.024M steps),
and reports each one's final deterministic return over seeds, scored by the
shared evaluator. Variants name per-system overrides (`VARIANTS`), so the
table says which difference between the systems matters.

Writes `results/quality_<env>.{json,md}`.
"""

import argparse
import dataclasses
import statistics
from typing import Any

from ._common import SYSTEM_NAMES, Spec, first_device, machine, publish, run_worker

VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (system, PPO or Brax `ppo.train` overrides, factory overrides)
    "brax": ("brax", {}, {}),
    "brax_max_grad_norm_0.5": ("brax", {"max_grad_norm": 0.5}, {}),
    "default": ("eqx", {}, {}),
    "no_clip": ("eqx", {"gradient_clipping": None}, {}),
    "min_std_1e-3": ("eqx", {}, {"min_std": 1e-3}),
    "no_clip_min_std_1e-3": ("eqx", {"gradient_clipping": None}, {"min_std": 1e-3}),
}


LABELS = {
    "brax": SYSTEM_NAMES["brax"],
    "brax_max_grad_norm_0.5": f"{SYSTEM_NAMES['brax']}, max_grad_norm=0.5",
    "default": "eqx_ppo (defaults: gradient_clipping=0.5)",
    "no_clip": "eqx_ppo, gradient_clipping=None (the old default)",
}


def run(base: Spec, variants: list[str], seeds: int, log=print):
    runs = []
    for seed in range(seeds):
        for name in variants:
            system, options, network = VARIANTS[name]
            spec = dataclasses.replace(
                base,
                system=system,
                seed=seed,
                eqx_ppo_options=options if system == "eqx" else {},
                brax_options=options if system == "brax" else {},
                eqx_network_options=network,
            )
            out = run_worker("benchmarks._worker", spec)
            out.update(seed=seed, system=system, variant=name)
            runs.append(out)
            ret = out.get("eval_return", float("nan"))
            log(f"  seed {seed} {name:24s} return {ret:8.2f}")
    return runs


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(r["variant"] for r in runs):
        returns = [r["eval_return"] for r in runs if r["variant"] == name]
        rows.append(
            {
                "variant": name,
                "returns": returns,
                "median": statistics.median(returns),
                "min": min(returns),
                "max": max(returns),
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    spec = Spec(**{**result["spec"], "hidden": tuple(result["spec"]["hidden"])})
    rows = table(result["runs"])
    lines = [
        f"## Learning quality on `{spec.env}` (reward scaling "
        f"{spec.reward_scaling:g}, {spec.total_steps:,} steps)",
        "",
        "| system / variant | median | min | max | per seed |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        name = LABELS.get(r["variant"], f"eqx_ppo, {r['variant']}")
        seeds = ", ".join(f"{x:.0f}" for x in r["returns"])
        lines.append(
            f"| {name} | {r['median']:.1f} | {r['min']:.1f} | {r['max']:.1f} "
            f"| {seeds} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1_024_000)
    parser.add_argument("--reward-scaling", type=float, default=10.0)
    parser.add_argument("--variants", default="brax,default", help=", ".join(VARIANTS))
    parser.add_argument(
        "--name", default=None, help="results file stem (default quality_<env>)"
    )
    args = parser.parse_args(argv)
    base = Spec(
        env=args.env,
        total_steps=args.steps,
        reward_scaling=args.reward_scaling,
        n_chunks=2,
    )
    started = machine()
    runs = run(base, args.variants.split(","), args.seeds)
    publish(
        args.name or f"quality_{args.env}",
        {"spec": dataclasses.asdict(base), "runs": runs, "device": first_device(runs)},
        markdown,
        started,
    )


if __name__ == "__main__":
    main()
