"""Compile time of this checkout against another, paired: trace, lower, XLA.

    python -m benchmarks.compile_ab --baseline ../base [--policy lstm] [--reps 3]

One short `train` run (`move_to_center`, 256 envs, 4x32 MLPs or the LSTM
policy, two chunks) per checkout and repetition, each in a fresh process,
alternating the checkouts. Per run: the seconds JAX spent tracing to
jaxprs, lowering to MLIR and compiling with XLA, summed over every program
(`jax.monitoring`'s duration events), and the compile + first chunk overhead
`compare` reports. Ratios (this checkout / baseline) are paired per
repetition. Each run imports its checkout's `eqx_ppo` and this checkout's
benchmarks (whose worker trains either API).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import machine, median, publish, spread

HERE = Path(__file__).resolve().parent.parent
FIELDS = ("trace_s", "lower_s", "xla_s", "compile_s")
_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "xla_s",
}


def measure(policy: str) -> dict[str, Any]:
    """In this process: one short run of the eqx_ppo on `sys.path`."""
    import jax

    from ._common import Spec
    from ._worker import run_eqx

    totals = dict.fromkeys(FIELDS, 0.0)

    def listen(event: str, duration: float, **kwargs: Any) -> None:
        if event in _EVENTS:
            totals[_EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    spec = Spec(
        env="move_to_center",
        policy=policy,
        total_steps=256 * 20 * 4,
        n_chunks=2,
        evaluate=False,
    )
    totals["compile_s"] = run_eqx(spec)["compile_s"]
    return totals | {"backend": jax.default_backend()}


def _run(checkout: Path, policy: str) -> dict[str, Any]:
    """`measure` in a fresh process whose `eqx_ppo` is `checkout`'s: a folder
    holding only a link to it comes first on the path, then this checkout."""
    with tempfile.TemporaryDirectory() as first:
        (Path(first) / "eqx_ppo").symlink_to(checkout / "eqx_ppo")
        env = {**os.environ, "PYTHONPATH": f"{first}{os.pathsep}{HERE}"}
        code = (
            "import json, benchmarks.compile_ab as c; "
            f"print(json.dumps(c.measure({policy!r})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=first,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(baseline: Path, policy: str, reps: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    for rep in range(reps):
        order = ("this", "baseline") if rep % 2 == 0 else ("baseline", "this")
        for label in order:
            checkout = HERE if label == "this" else baseline
            runs[label].append(_run(checkout, policy))
            print(f"  rep {rep} {label:8s} {runs[label][-1]}", flush=True)
    backend = {r.pop("backend") for rs in runs.values() for r in rs}
    ratios = {
        f: [a[f] / b[f] for a, b in zip(runs["this"], runs["baseline"], strict=True)]
        for f in FIELDS
    }
    return {
        "policy": policy,
        "baseline": str(baseline),
        "runs": runs,
        "ratios": ratios,
        "device": {"backend": backend.pop()},
    }


def markdown(result: dict[str, Any]) -> str:
    runs, m = result["runs"], result["machine"]
    names = {
        "trace_s": "tracing",
        "lower_s": "lowering",
        "xla_s": "XLA",
        "compile_s": "compile + first chunk",
    }
    lines = [
        f"### Compile time against `{Path(result['baseline']).name}`: "
        f"`move_to_center`, {result['policy']} policy",
        "",
        f"{len(runs['this'])} repetitions, each checkout in a fresh process, "
        f"alternated; on {m.get('backend', '?')} ({m.get('cpu_count', '?')} cores). "
        "Seconds, median [min-max]; ratio paired per repetition.",
        "",
        "| | this checkout (s) | baseline (s) | ratio |",
        "|---|---|---|---|",
    ]
    for field, name in names.items():
        this = [r[field] for r in runs["this"]]
        base = [r[field] for r in runs["baseline"]]
        lines.append(
            f"| {name} | {spread(this)} | {spread(base)} "
            f"| {median(result['ratios'][field]):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other checkout")
    parser.add_argument("--policy", default="mlp", choices=["mlp", "lstm"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default=None, help="results file stem")
    args = parser.parse_args(argv)
    started = machine()
    result = run(Path(args.baseline).resolve(), args.policy, args.reps)
    publish(args.name or f"compile_ab_{args.policy}", result, markdown, started)


if __name__ == "__main__":
    main()
