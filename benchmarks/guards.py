"""What the stability guards cost: `step` time with each guard on and off.

    python -m benchmarks.guards --env move_to_center [--reps 5]

Compiles one `step` per variant (the old defaults, each guard alone, the
new defaults, and the optional guards), then times them in alternation,
`--reps` rounds of `compile_and_time`'s median, so a drift of the machine's
load hits every variant alike. Reports milliseconds per iteration and the
ratio to the old defaults (no clipping, no finite checks), measured in the
same run. Writes `results/guards_<env>.{json,md}`.
"""

import argparse
import dataclasses
import statistics
from typing import Any

from ._common import Spec, eqx_env, machine, publish
from .ceilings import compile_and_time, time_calls

VARIANTS: dict[str, dict[str, Any]] = {
    "old defaults": {"gradient_clipping": None, "check_finite": False},
    "+ check_finite": {"gradient_clipping": None, "check_finite": True},
    "+ gradient_clipping=0.5": {"gradient_clipping": 0.5, "check_finite": False},
    "new defaults (both)": {},
    "new + target_kl=0.02": {"target_kl": 0.02},
    "new + value_clip_range=0.2": {"value_clip_range": 0.2},
}


def measure(spec: Spec, reps: int) -> dict[str, Any]:
    import equinox as eqx
    import jax

    import eqx_ppo
    from eqx_ppo.ppo._step import step

    from ._worker import eqx_config, eqx_network

    env = eqx_env(spec.env)
    network = eqx_network(spec, env, jax.random.key(spec.seed))
    steps = {}
    for name, options in VARIANTS.items():
        config = eqx_config(dataclasses.replace(spec, eqx_ppo_options=options)).learner
        state = eqx.filter_jit(eqx_ppo.init)(
            env, network, config, key=jax.random.key(spec.seed + 1)
        )
        one_step = eqx.filter_jit(lambda s, config=config: step(env, config, s))
        steps[name] = (compile_and_time(one_step, state)[0], state)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(reps):
        for name, (compiled, state) in steps.items():
            times[name].append(time_calls(compiled, state)["ms"])
    base = statistics.median(times["old defaults"])
    return {
        "spec": dataclasses.asdict(spec),
        "reps": reps,
        "ms": times,
        "rows": [
            {
                "variant": name,
                "ms": statistics.median(ms),
                "ratio": statistics.median(ms) / base,
            }
            for name, ms in times.items()
        ],
    }


def markdown(result: dict[str, Any]) -> str:
    spec = result["spec"]
    lines = [
        f"## Cost of the guards on `{spec['env']}` ({spec['n_envs']} envs x "
        f"{spec['rollout_length']} steps, {result['reps']} alternated rounds)",
        "",
        "| variant | step ms (median) | ratio to old defaults |",
        "|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['variant']} | {r['ms']:.1f} | {r['ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="move_to_center")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--name", default=None, help="results file stem (default guards_<env>)"
    )
    args = parser.parse_args(argv)
    started = machine()
    result = measure(Spec(env=args.env), args.reps)
    publish(args.name or f"guards_{args.env}", result, markdown, started)


if __name__ == "__main__":
    main()
