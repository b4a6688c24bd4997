"""Each system's device op time in its own training run, by HLO category and op.

    python -m benchmarks.op_trace [--systems brax,eqx] [--env cartpole]
        [--n-envs 8192] [--hidden 256,256,256,256] [--minibatches 32]
        [--iterations 10]

Where `benchmarks.profile` attributes one compiled eqx_ppo program to its
source lines, this compares systems on the same run. Each trains in its own
worker process (`_worker.RUNNERS`) for `--iterations` iterations in two
chunks; a `jax.profiler` trace starts at the first chunk boundary, when
every program has been compiled and run once, and stops when training ends,
so it holds the second chunk. The device's "XLA Ops" events are summed per
HLO category (`hlo_category`: convolution fusion, loop fusion, ...) and per
op, per iteration; control-flow ops, whose events span the ops they run,
are left out. A backend whose trace has no device op lines (a CPU) gives
no table. The parent never imports JAX. Written to
`results/<backend>_op_trace_<env>_<n_envs>_<layers>x<width>.{json,md}`.
"""

import argparse
import collections
import dataclasses
import sys
import tempfile
from typing import Any

from ._common import Spec, first_device, machine, publish, run_worker
from .profile import _trace_events, device_op_lines

_CONTROL_FLOW = {"while", "conditional", "call"}


def device_ops(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The op executions on the trace's device "XLA Ops" lines, as
    `{"name", "category", "long_name", "dur"}` (microseconds)."""
    _, op_lines = device_op_lines(events)
    out = []
    for e in events:
        if e.get("ph") != "X" or (e.get("pid"), e.get("tid")) not in op_lines:
            continue
        args = e.get("args") or {}
        category = str(args.get("hlo_category", "unknown"))
        if category in _CONTROL_FLOW:
            continue
        out.append(
            {
                "name": e["name"],
                "category": category,
                "long_name": str(args.get("long_name", ""))[:300],
                "dur": float(e["dur"]),
            }
        )
    return out


def summarise(ops: list[dict[str, Any]], iterations: int, top: int) -> dict[str, Any]:
    """Op time and count per iteration, by category and for the `top` ops."""

    def table(key: str) -> list[dict[str, Any]]:
        total: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for op in ops:
            total[op[key]][0] += 1
            total[op[key]][1] += op["dur"]
        ranked = sorted(total.items(), key=lambda kv: -kv[1][1])
        return [
            {
                "name": name,
                "ms": us / 1e3 / iterations,
                "ops": n / iterations,
                "us_per_op": us / n,
            }
            for name, (n, us) in ranked
        ]

    long_names = {op["name"]: op["long_name"] for op in ops}
    top_ops = [{**row, "long_name": long_names[row["name"]]} for row in table("name")]
    return {
        "op_ms": sum(op["dur"] for op in ops) / 1e3 / iterations,
        "by_category": table("category"),
        "top_ops": top_ops[:top],
    }


def _worker(spec: Spec, iterations: int, top: int) -> dict[str, Any]:
    import jax

    from . import _worker

    directory = tempfile.mkdtemp()
    mark = _worker.Boundaries.mark

    def mark_and_trace(self, step):
        before = len(self.marks)
        mark(self, step)
        if before == 0 and len(self.marks) == 1:
            jax.profiler.start_trace(directory, create_perfetto_trace=True)

    _worker.Boundaries.mark = mark_and_trace  # the class `_common` defines
    run = _worker.RUNNERS[spec.system](spec)
    jax.profiler.stop_trace()
    ops = device_ops(_trace_events(directory))
    traced = -(-iterations // spec.n_chunks)  # the second of two chunks
    return {
        "system": spec.system,
        "sps": run["sps"],
        "traced_iterations": traced,
        **summarise(ops, traced, top),
    }


def markdown(result: dict[str, Any]) -> str:
    spec, runs = result["spec"], result["runs"]
    m = result["machine"]
    lines = [
        f"### Device op time per iteration: `{spec['env']}`, {spec['n_envs']} envs, "
        f"{len(spec['hidden'])}x{spec['hidden'][0]} MLPs, "
        f"{spec['n_minibatches']} minibatches",
        "",
        f"Each system's own training run, traced from its second chunk "
        f"(`python -m benchmarks.op_trace`). JAX {m.get('jax', '?')} on "
        f"{m.get('backend', '?')} ({m.get('device_kind', '?')}).",
    ]
    failed = [r for r in runs if "error" in r]
    runs = [r for r in runs if "error" not in r]
    lines += [f"\n{r['system']} failed: {r['error'][-300:]}" for r in failed]
    if not runs or not any(r["by_category"] for r in runs):
        lines += ["", "The traces hold no device op lines: no table on this backend."]
        return "\n".join(lines) + "\n"
    categories = list(
        dict.fromkeys(row["name"] for r in runs for row in r["by_category"])
    )
    lines += [
        "",
        "| HLO category | "
        + " | ".join(f"{r['system']}: ms (ops)" for r in runs)
        + " |",
        "|---|" + "---|" * len(runs),
    ]
    for category in categories:
        cells = []
        for r in runs:
            row = next((x for x in r["by_category"] if x["name"] == category), None)
            cells.append("-" if row is None else f"{row['ms']:.2f} ({row['ops']:,.0f})")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    lines.append("| all ops | " + " | ".join(f"{r['op_ms']:.2f}" for r in runs) + " |")
    for r in runs:
        lines += [
            "",
            f"{r['system']}: {r['sps'] / 1e6:.2f}M env-steps/s while traced; "
            f"its largest ops:",
            "",
            "| op | ms / iteration | calls / iteration | us / call | HLO |",
            "|---|---|---|---|---|",
        ]
        for op in r["top_ops"]:
            lines.append(
                f"| `{op['name']}` | {op['ms']:.2f} | {op['ops']:.0f} | "
                f"{op['us_per_op']:.1f} | `{op['long_name'][:120]}` |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="brax,eqx")
    parser.add_argument(
        "--env", default="cartpole", choices=["cartpole", "inverted_pendulum"]
    )
    parser.add_argument("--n-envs", type=int, default=8192)
    parser.add_argument("--hidden", default="256,256,256,256")
    parser.add_argument("--minibatches", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--name", default=None, help="results file stem")
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)  # in a worker
    args = parser.parse_args(argv)
    if args.spec is not None:
        from ._common import emit

        emit(_worker(Spec.from_json(args.spec), args.iterations, args.top))
        return
    hidden = tuple(int(w) for w in args.hidden.split(","))
    started = machine()
    base = Spec(
        env=args.env,
        n_envs=args.n_envs,
        hidden=hidden,
        n_minibatches=args.minibatches,
        total_steps=args.n_envs * 20 * args.iterations,
        n_chunks=2,
        evaluate=False,
    )
    extra = ["--iterations", str(args.iterations), "--top", str(args.top)]
    runs = []
    for system in args.systems.split(","):
        spec = dataclasses.replace(base, system=system)
        worker = run_worker("benchmarks.op_trace", spec, extra=extra)
        runs.append({"system": system, **worker})
        print(f"{system}: {'failed' if 'error' in worker else 'traced'}", flush=True)
    spec = {k: v for k, v in dataclasses.asdict(base).items() if k != "system"}
    result = {"spec": spec, "runs": runs, "device": first_device(runs)}
    name = f"op_trace_{args.env}_{args.n_envs}_{len(hidden)}x{hidden[0]}"
    publish(args.name or name, result, markdown, started)


if __name__ == "__main__":
    sys.exit(main())
