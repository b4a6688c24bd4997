"""Where eqx_ppo's time goes: a per-op profile of one compiled program.

    python -m benchmarks.profile --env move_to_center [--policy lstm]
        [--part update|step] [--seeds 16 --n-envs 64] [--hidden 256,256,256,256]
        [--minibatches 32]

Compiles the update alone (`step` on a fixed rollout, as `ceilings` times
it) or a whole `step`, vmapped over `--seeds` training states when more
than one, traces a few calls with `jax.profiler`, and attributes every XLA op
that ran to the innermost eqx_ppo source line it was traced from (read from
the compiled HLO's stack frames) and to its op kind (`dot`, `ynn_fusion`,
`copy`, ...). Printed and written to
`results/profile_<env>_<policy>_<part>_<seeds>x<n_envs>.{json,md}`;
`benchmarks.report` pastes every such table into `benchmarks/README.md`.

Two totals frame the tables: the op time per call (summed over threads) and
the share of the wall time in which at least one thread was running an op.
Op time close to the wall time with a high busy share means the program is a
chain of dependent ops: it gets faster only with fewer or shorter ops on that
chain, not with more parallel work.
"""

import argparse
import collections
import dataclasses
import gzip
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from ._common import Spec, eqx_env, machine, publish
from .ceilings import compile_and_time, rollout_step, update_step

_TRACED_CALLS = 3
# Their trace events span the ops of the computations they run, which are
# counted themselves.
_CONTAINERS = {"while", "call", "conditional"}


def _program(spec: Spec, part: str):
    """The jitted function and its arguments (array leaves only)."""
    import equinox as eqx
    import jax

    import eqx_ppo
    from eqx_ppo.ppo._step import step

    from ._worker import eqx_config, eqx_network

    env = eqx_env(spec.env)
    config = eqx_config(spec).learner

    def init(key):
        network = eqx_network(spec, env, key)
        return eqx_ppo.init(env, network, config, key=jax.random.fold_in(key, 1))

    if part == "update":
        body, collect = update_step(env, config), rollout_step(env, config)

        def make_args(key):
            state = init(key)
            return (state, *collect(state))

    else:

        def body(state):
            return step(env, config, state)

        def make_args(key):
            return (init(key),)

    if spec.n_seeds > 1:
        body, make_args = eqx.filter_vmap(body), eqx.filter_vmap(make_args)
        key = jax.random.split(jax.random.key(spec.seed), spec.n_seeds)
    else:
        key = jax.random.key(spec.seed)
    args = eqx.filter_jit(make_args)(key)
    dynamic, static = eqx.partition(args, eqx.is_array)
    jitted = jax.jit(lambda d: body(*eqx.combine(d, static)))
    return jitted, dynamic


def _stack_frames(hlo: str) -> dict[int, str]:
    """Stack frame id -> innermost eqx_ppo `file:line (function)` on it."""
    tables: dict[str, dict[int, str]] = {}
    name = None
    for line in hlo[hlo.find("\nFileNames") :].splitlines():
        if re.fullmatch(r"[A-Za-z]+", line):
            name = line
            tables[name] = {}
        elif name and (m := re.match(r"(\d+) (.*)", line)):
            tables[name][int(m.group(1))] = m.group(2)

    def fields(text: str) -> dict[str, int]:
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}

    files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
    functions = {k: v.strip('"') for k, v in tables.get("FunctionNames", {}).items()}
    locations = {}
    for k, v in tables.get("FileLocations", {}).items():
        f = fields(v)
        path = files[f["file_name_id"]]
        if "/eqx_ppo/" in path:
            short = path[path.rindex("/eqx_ppo/") + 1 :]
            function = functions.get(f["function_name_id"], "?")
            function = function.replace("<locals>.", "")
            locations[k] = f"{short}:{f['line']} ({function})"
    frames = {k: fields(v) for k, v in tables.get("StackFrames", {}).items()}
    out = {}
    for frame_id in frames:
        seen, current = set(), frame_id
        while current in frames and current not in seen:
            seen.add(current)
            where = locations.get(frames[current]["file_location_id"])
            if where is not None:
                out[frame_id] = where
                break
            current = frames[current].get("parent_frame_id", 0)
    return out


def _instructions(hlo: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (op kind, eqx_ppo source) for every leaf op.

    Ops of a backward pass (under `transpose(...)` in their op name) are
    marked as such, so a layer's forward and backward cost show separately.
    """
    frames = _stack_frames(hlo)
    out = {}
    pattern = r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w\-]*)\((.*)$"
    for m in re.finditer(pattern, hlo, re.M):
        name, opcode, rest = m.groups()
        if opcode in _CONTAINERS:
            continue
        frame = re.search(r"stack_frame_id=(\d+)", rest)
        source = (
            frames.get(int(frame.group(1)), "outside eqx_ppo")
            if frame
            else "no stack frame (copies XLA inserted)"
        )
        op_name = re.search(r'op_name="([^"]*)"', rest)
        if op_name and "transpose(" in op_name.group(1):
            source += ", backward"
        out[name] = (re.sub(r"\.\d+$", "", name), source)
    return out


def _trace_events(directory: str) -> list[dict[str, Any]]:
    """Every event of the trace `jax.profiler` wrote under `directory`: the
    host's `<host>.trace.json.gz` if there is one, else the Perfetto file.
    Raises if it wrote neither."""
    files = sorted(Path(directory).rglob("*.json.gz"))
    preferred = [f for f in files if not f.name.startswith("perfetto")] or files
    if not preferred:
        raise RuntimeError(f"jax.profiler wrote no JSON trace under {directory}")
    with gzip.open(preferred[0]) as f:
        return json.load(f)["traceEvents"]


def _module_name(hlo: str) -> str | None:
    """The compiled module's name, as trace events name it (`hlo_module`)."""
    m = re.match(r"\s*HloModule ([\w.\-]+)", hlo)
    return m.group(1) if m else None


def device_op_lines(
    events: list[dict[str, Any]],
) -> tuple[set[Any], set[tuple[Any, Any]]]:
    """The trace's device processes (`/device:TPU:0`, ...) and, as
    `(pid, tid)`, their "XLA Ops" lines, where device backends put the
    executions of a program's ops."""

    def named(kind: str) -> dict[Any, str]:
        return {
            (e.get("pid"), e.get("tid"))
            if kind == "thread_name"
            else e.get("pid"): str(e.get("args", {}).get("name", ""))
            for e in events
            if e.get("ph") == "M" and e.get("name") == kind
        }

    devices = {pid for pid, name in named("process_name").items() if "/device:" in name}
    op_lines = {
        line
        for line, name in named("thread_name").items()
        if line[0] in devices and name.startswith("XLA Ops")
    }
    return devices, op_lines


def _op_events(
    events: list[dict[str, Any]], ops: dict[str, Any], module: str | None
) -> list[dict[str, Any]]:
    """The trace's executions of the compiled program's ops, as
    `{"name", "ts", "dur"}`.

    Backends name them differently: XLA:CPU's events carry the op in their
    name and in `args["hlo_op"]`; device backends put them on device
    processes (`/device:TPU:0`, ...) next to module and step events, and may
    name the op only in `args`. An event counts when its op (either name,
    without a leading `%`) is one of `ops`, its `hlo_module`, where given,
    is `module`, and, when the trace has device processes, it is on one
    (on their "XLA Ops" lines, where they have such lines): a host-side
    event of the same name (a launch) or a framework op named like an
    instruction is no op execution.
    """

    devices, op_lines = device_op_lines(events)
    out = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        if devices and e.get("pid") not in devices:
            continue
        if op_lines and (e.get("pid"), e.get("tid")) not in op_lines:
            continue
        args = e.get("args") or {}
        owner = str(args.get("hlo_module", "")).split("(")[0]
        if module and owner and owner != module:
            continue
        for candidate in (args.get("hlo_op"), e.get("name")):
            name = str(candidate or "").lstrip("%")
            if name in ops:
                out.append({"name": name, "ts": e["ts"], "dur": e["dur"]})
                break
    return out


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Time covered by the union of `(start, end)` intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def profile(spec: Spec, part: str, top: int) -> dict[str, Any]:
    import jax

    jitted, args = _program(spec, part)
    compiled, timing = compile_and_time(jitted, args)
    text = compiled.as_text()
    ops = _instructions(text)
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            for _ in range(_TRACED_CALLS):
                jax.block_until_ready(compiled(args))
        events = _trace_events(directory)
    result = {
        "spec": dataclasses.asdict(spec),
        "part": part,
        "compile_s": timing["compile_s"],
        "wall_ms": timing["ms"],
        **attribute(events, ops, _module_name(text), top),
    }
    return result


def attribute(
    events: list[dict[str, Any]], ops: dict[str, Any], module: str | None, top: int
) -> dict[str, Any]:
    """Op time per call by eqx_ppo source line and by op kind, the busy share;
    or, for a trace without per-op events, `per_op` false and the trace's
    process and thread names (what the trace held instead)."""
    matched = _op_events(events, ops, module)
    if not matched:
        lines = sorted(
            {
                str(e.get("args", {}).get("name", ""))
                for e in events
                if e.get("ph") == "M"
                and e.get("name") in ("process_name", "thread_name")
            }
        )
        return {"per_op": False, "trace_lines": lines[:40], "events": len(events)}
    by_source: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in matched:
        kind, source = ops[e["name"]]
        for table, key in ((by_source, source), (by_kind, kind)):
            table[key][0] += 1 / _TRACED_CALLS
            table[key][1] += e["dur"] / 1e3 / _TRACED_CALLS
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in matched]
    span = max(b for _, b in intervals) - min(a for a, _ in intervals)

    def rows(table):
        ranked = sorted(table.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"name": k, "ops": round(n), "ms": ms} for k, (n, ms) in ranked]

    return {
        "per_op": True,
        "op_ms": sum(ms for _, ms in by_kind.values()),
        "ops": round(sum(n for n, _ in by_kind.values())),
        "busy_share": _busy_us(intervals) / span if span > 0 else 1.0,
        "by_source": rows(by_source),
        "by_kind": rows(by_kind),
    }


def markdown(result: dict[str, Any]) -> str:
    spec = result["spec"]
    seeds = f"{spec['n_seeds']} seeds x " if spec["n_seeds"] > 1 else ""
    lines = [
        f"#### Profile: `{spec['env']}`, {spec['policy']} policy, "
        f"{result['part']} ({seeds}{spec['n_envs']} envs x "
        f"{spec['rollout_length']} steps)",
        "",
    ]
    if not result.get("per_op", True):
        lines.append(
            f"{result['wall_ms']:.1f} ms wall per call. The trace holds no per-op "
            f"events of the program ({result['events']:,} events; its lines: "
            f"{', '.join(result['trace_lines']) or 'none'}), so there is no "
            "per-op table."
        )
        return "\n".join(lines) + "\n"
    lines.append(
        f"{result['wall_ms']:.1f} ms wall per call; {result['op_ms']:.1f} ms of "
        f"op time in {result['ops']:,} op executions; at least one op running "
        f"{100 * result['busy_share']:.0f}% of the traced time."
    )
    for key, what in (("by_source", "eqx_ppo source"), ("by_kind", "XLA op")):
        lines += ["", f"| {what} | op time (ms) | share | ops |", "|---|---|---|---|"]
        for row in result[key]:
            lines.append(
                f"| `{row['name']}` | {row['ms']:.2f} "
                f"| {100 * row['ms'] / result['op_ms']:.0f}% | {row['ops']:,} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        default="move_to_center",
        choices=["inverted_pendulum", "move_to_center", "cartpole"],
    )
    parser.add_argument("--policy", default="mlp", choices=["mlp", "lstm"])
    parser.add_argument("--part", default="update", choices=["update", "step"])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument(
        "--hidden", default="32,32,32,32", help="MLP widths, e.g. 256,256,256,256"
    )
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument(
        "--name",
        default=None,
        help="results file stem (default profile_<env>_<policy>_<part>_<n>x<envs>)",
    )
    args = parser.parse_args(argv)
    hidden = tuple(int(w) for w in args.hidden.split(","))
    spec = Spec(
        env=args.env,
        policy=args.policy,
        n_envs=args.n_envs,
        n_seeds=args.seeds,
        hidden=hidden,
        n_minibatches=args.minibatches,
    )
    started = machine()
    result = profile(spec, args.part, args.top)
    name = f"profile_{args.env}_{args.policy}_{args.part}_{args.seeds}x{args.n_envs}"
    if hidden != Spec.hidden:
        name += f"_{len(hidden)}x{hidden[0]}"
    publish(args.name or name, result, markdown, started)


if __name__ == "__main__":
    main()
