"""Shared pieces of the benchmarks: run specs, envs, the common evaluator, memory,
subprocess workers and result files.

Measured training runs happen in worker processes: one per run (`run_worker`),
so compile caches, allocator state and peak RSS never leak from one system
into the next, or several runs in one (`run_session`), where opening the
device costs more than the runs (a TPU). A process that only orchestrates
never imports JAX: on a TPU only one process can hold the chip, so the
parent reads versions from package metadata and the backend from its first
worker (`machine`, `device_info`, `publish`).
"""

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(
    os.environ.get("EQX_PPO_BENCH_RESULTS")
    or Path(__file__).resolve().parent / "results"
)
"""Where `publish` writes; `EQX_PPO_BENCH_RESULTS` moves it (and every
worker's) elsewhere, e.g. into a folder an accelerator host sends back."""

SYSTEMS = ("eqx", "brax", "nnx")
SYSTEM_NAMES = {
    "eqx": "eqx_ppo",
    "base": "eqx_ppo baseline",
    "brax": "Brax PPO",
    "nnx": "nnx-ppo 0.3.0",
    "rejax": "rejax PPO",
}
BASELINE_ENV = "EQX_PPO_BASELINE"
"""Names a checkout of eqx_ppo that the `base` system imports (an A/B baseline)."""
EPISODE_LENGTH = {
    "inverted_pendulum": 1000,
    "move_to_center": 20,
    "cartpole": 500,
    "cartpole_balance": 1000,
}
PLAYGROUND = {"cartpole_balance": "CartpoleBalance"}
"""Benchmark envs from MuJoCo Playground, by their Playground name; all run
with `impl="jax"` (MJX), the backend every system here can trace."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One training run: the system, the env, the policy and the PPO settings.

    The defaults are the issue's fair 2-core setting: 256 envs, rollout 20,
    8 minibatches, 4 epochs, 4x32 swish actor and critic, obs normalisation.
    `n_chunks` is the number of timing boundaries: the first chunk holds the
    compilation, the others give the steady-state throughput. `evaluate`
    scores the trained policy with the shared evaluator after training;
    `driver_eval` turns on eqx_ppo's own evaluation (at the start and the
    end of the run), whose program `compile_time` measures.
    """

    system: str = "eqx"
    env: str = "inverted_pendulum"
    policy: str = "mlp"
    n_envs: int = 256
    rollout_length: int = 20
    n_minibatches: int = 8
    n_epochs: int = 4
    hidden: tuple[int, ...] = (32, 32, 32, 32)
    lstm_size: int = 32
    total_steps: int = 1_024_000
    n_chunks: int = 10
    n_seeds: int = 1
    learning_rate: float = 3e-4
    discount: float = 0.97
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    entropy_weight: float = 1e-2
    seed: int = 0
    eval_envs: int = 64
    evaluate: bool = True
    driver_eval: bool = False
    reward_scaling: float = 1.0
    # Per-system overrides for A/B experiments: eqx_ppo's `PPO` and factory
    # keywords, Brax's `ppo.train` keywords.
    eqx_ppo_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    eqx_network_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    brax_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def steps_per_iteration(self) -> int:
        return self.n_envs * self.rollout_length

    @property
    def chunk_steps(self) -> int:
        """Env steps (of one seed) between two timing boundaries."""
        iterations = -(-self.total_steps // self.steps_per_iteration)
        per_chunk = -(-iterations // self.n_chunks)
        return per_chunk * self.steps_per_iteration

    @property
    def run_steps(self) -> int:
        """Steps actually trained (of one seed): whole chunks."""
        return self.chunk_steps * self.n_chunks

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Spec":
        """The inverse of `dataclasses.asdict` (and of JSON's list for `hidden`)."""
        if "hidden" in raw:
            raw = {**raw, "hidden": tuple(raw["hidden"])}
        return cls(**raw)


# --------------------------------------------------------------------------- envs


def eqx_env(name: str):
    """The env as eqx_ppo (and, adapted, nnx-ppo) steps it: time-limited, auto-reset
    by the trainer. Brax's `inverted_pendulum` uses the `spring` backend."""
    from eqx_ppo import envs

    if name == "inverted_pendulum":
        from brax import envs as brax_envs

        raw = brax_envs.get_environment("inverted_pendulum", backend="spring")
        return envs.EpisodeWrapper(raw, EPISODE_LENGTH[name])
    if name in ("move_to_center", "cartpole"):
        return envs.make(name, episode_length=EPISODE_LENGTH[name])
    if name in PLAYGROUND:
        return envs.make(
            f"playground:{PLAYGROUND[name]}",
            impl="jax",
            episode_length=EPISODE_LENGTH[name],
        )
    raise ValueError(f"unknown benchmark env {name!r}")


class KeepInfo:
    """Carries `info` over from the input state, as Brax's training wrappers need.

    eqx_ppo's built-in envs rebuild their state each step with an empty `info`
    (their own `EpisodeWrapper` adds its keys); Brax's wrappers store theirs in
    `info` before stepping and read them back after.
    """

    def __init__(self, env):
        self.env = env

    def reset(self, key):
        return self.env.reset(key)

    def step(self, state, action):
        out = self.env.step(state, action)
        return out.replace(info={**state.info, **out.info})

    @property
    def observation_size(self):
        return self.env.observation_size

    @property
    def action_size(self):
        return self.env.action_size


def raw_env(name: str):
    """The env without a time limit, for trainers that add their own (Brax)."""
    if name == "inverted_pendulum":
        from brax import envs as brax_envs

        return brax_envs.get_environment("inverted_pendulum", backend="spring")
    if name in PLAYGROUND:
        from mujoco_playground import registry

        return registry.load(PLAYGROUND[name], config_overrides={"impl": "jax"})
    from eqx_ppo import envs

    return KeepInfo(envs.make(name, episode_length=None))


def evaluate(env, act, policy, init_carry, spec: Spec) -> float:
    """Mean undiscounted return of one deterministic episode per env.

    The same function scores every system, on `spec.eval_envs` envs for the
    env's episode length with one fixed key, so returns are comparable.
    `act(policy, carry, obs, key) -> (carry, actions)` works on a batch of
    envs; `policy` is its array pytree. Each env counts the rewards up to and
    including its first `done`; envs are never reset.
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    n_envs, length = spec.eval_envs, EPISODE_LENGTH[spec.env]

    @eqx.filter_jit
    def run(policy, carry, key):
        reset_key, act_key = jax.random.split(key)
        state = jax.vmap(env.reset)(jax.random.split(reset_key, n_envs))

        # The policy rides in the carry: flax.nnx modules rebuilt inside the
        # scan body refuse to update their RNG counters from an outer trace.
        def step(c, k):
            policy, state, carry, alive, total = c
            carry, actions = act(policy, carry, state.obs, k)
            state = jax.vmap(env.step)(state, actions)
            total = total + jnp.where(alive, state.reward, 0.0)
            alive = alive & (state.done == 0)
            return (policy, state, carry, alive, total), None

        init = (policy, state, carry, jnp.ones(n_envs, bool), jnp.zeros(n_envs))
        (_, _, _, _, total), _ = jax.lax.scan(
            step, init, jax.random.split(act_key, length)
        )
        return jnp.mean(total)

    return float(run(policy, init_carry, jax.random.key(1234)))


# ------------------------------------------------------------------------ memory


def peak_rss_mb() -> float:
    """This process's peak resident set size (VmHWM), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------------ timing


class Boundaries:
    """Wall-clock times at chunk ends, from a training callback.

    `mark(step)` records the wall and process CPU times when `step` (env steps
    of one seed) closes a chunk. `summary()` turns them into steady-state
    throughput (from the end of the first chunk to the end of the last) and
    compile time (the first chunk's time minus what running it would cost at
    the steady rate).
    """

    def __init__(self, spec: Spec):
        self.spec = spec
        self.start = time.perf_counter()
        self.start_cpu = time.process_time()
        self.marks: list[tuple[float, int]] = []
        self.cpu_marks: list[float] = []

    def mark(self, step: int) -> None:
        if step > 0 and step % self.spec.chunk_steps == 0:
            if not self.marks or self.marks[-1][1] != step:
                self.marks.append((time.perf_counter(), step))
                self.cpu_marks.append(time.process_time())

    def summary(self) -> dict[str, Any]:
        if len(self.marks) < 2:
            raise RuntimeError(
                f"only {len(self.marks)} chunk boundaries recorded; need >= 2"
            )
        (t1, s1), (tn, sn) = self.marks[0], self.marks[-1]
        seeds = self.spec.n_seeds
        sps = (sn - s1) * seeds / (tn - t1)
        first = t1 - self.start
        per_chunk = [
            (b[1] - a[1]) * seeds / (b[0] - a[0])
            for a, b in zip(self.marks, self.marks[1:], strict=False)
        ]
        cpu = self.cpu_marks[-1] - self.cpu_marks[0]
        return {
            "sps": sps,
            # CPU seconds (all threads) per million steady steps: the work done,
            # much less sensitive than wall time to other load on the machine.
            "cpu_s_per_mstep": cpu / ((sn - s1) * seeds) * 1e6,
            "sps_chunks": per_chunk,
            "first_chunk_s": first,
            "compile_s": max(0.0, first - s1 * seeds / sps),
            "train_wall_s": tn - self.start,
            "steps": sn * seeds,
        }


# --------------------------------------------------------------------- processes

ROOT = Path(__file__).resolve().parent.parent


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process: this one's, warnings off, `extra` set."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.update(extra or {})
    return env


def run_worker(
    module: str, spec: Spec, *, timeout: float = 900.0, extra: list[str] | None = None
) -> dict[str, Any]:
    """Run `python -m <module> <spec json>` and parse its last stdout line (JSON).

    A failed run returns `{"error": ...}` instead of raising, so one broken
    system does not lose the other systems' numbers.
    """
    cmd = [sys.executable, "-m", module, spec.to_json(), *(extra or [])]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=worker_env(),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s", "spec": spec.to_json()}
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-3000:]
        return {"error": f"exit {proc.returncode}: {tail}", "process_wall_s": wall}
    out = json.loads(lines[-1])
    out["process_wall_s"] = wall
    return out


def run_session(
    items: list[dict[str, Any]],
    *,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    deadline: float | None = None,
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    restarts: int = 2,
) -> list[dict[str, Any]]:
    """Run `items` one after another in one worker process; their results, in order.

    The worker (`command`, by default `python -m benchmarks._worker
    --session`, with the session as its last argument) prints one JSON line
    `{"event": "ready", "device": ...}` when it holds the device, then one
    line `{"index": i, "result": ...}` per item as each finishes (the
    parent adds `"device"` to each result);
    `on_ready(device)` and `on_result(i, result)` see them as they come, so a
    caller can write results before the session ends. A worker that dies
    mid-item leaves that item an `{"error": ...}` with the end of its stderr;
    a fresh worker (at most `restarts` times) takes the items after it.
    `deadline` (a `time.time()`) is passed on: the worker skips an item whose
    `estimate_s` would end past it, and the parent kills a worker still
    running a minute after it.
    """
    results: list[dict[str, Any] | None] = [None] * len(items)
    pending = list(range(len(items)))
    base = command or [sys.executable, "-m", "benchmarks._worker", "--session"]
    attempt = 0
    device = None
    while pending and attempt <= restarts:
        attempt += 1
        session = {"items": [items[i] for i in pending], "deadline": deadline}
        with tempfile.TemporaryFile("w+") as stderr:
            with subprocess.Popen(
                [*base, json.dumps(session)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=ROOT,
                env=env or worker_env(),
            ) as proc:
                timer = None
                if deadline is not None:
                    left = max(0.0, deadline - time.time() + 60)
                    timer = threading.Timer(left, proc.kill)
                    timer.start()
                try:
                    for line in proc.stdout:
                        if not line.startswith("{"):
                            continue
                        message = json.loads(line)
                        if message.get("event") == "ready":
                            device = message["device"]
                            if on_ready is not None:
                                on_ready(device)
                            continue
                        index = pending[message["index"]]
                        results[index] = {**message["result"], "device": device}
                        if on_result is not None:
                            on_result(index, results[index])
                    code = proc.wait()
                except BaseException:
                    proc.kill()
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
            stderr.seek(0)
            tail = stderr.read()[-3000:]
        pending = [i for i in pending if results[i] is None]
        if pending:
            lost = pending.pop(0)
            results[lost] = {"error": f"worker exited {code} during this run: {tail}"}
            if on_result is not None:
                on_result(lost, results[lost])
    for i in pending:
        results[i] = {"error": "not run: the worker failed too often"}
    return [r for r in results if r is not None]


def serve_session(
    payload: str,
    run_item: Callable[[dict[str, Any]], dict[str, Any]],
    warm_up: Callable[[], None] | None = None,
) -> None:
    """The worker side of `run_session`: run each item of the JSON `payload`.

    `warm_up()` runs first (opening the device, importing the systems), so
    no item's compile time includes it; then the ready line, with
    `device_info()`, and one line per item as it ends. An item that raises
    gives `{"error": <traceback>}`; one whose `estimate_s` would end past
    the session's deadline is skipped (an error saying so) without running.
    """
    session = json.loads(payload)
    deadline = session.get("deadline")
    t0 = time.perf_counter()
    if warm_up is not None:
        warm_up()
    ready = {"event": "ready", "device": device_info()}
    print(json.dumps({**ready, "warm_up_s": time.perf_counter() - t0}), flush=True)
    for index, item in enumerate(session["items"]):
        estimate = item.get("estimate_s", 0.0)
        if deadline is not None and time.time() + estimate > deadline:
            result = {
                "error": f"skipped: its estimated {estimate:.0f} s would end "
                "past the session's deadline",
                "skipped": True,
            }
        else:
            try:
                result = run_item(item)
            except Exception:  # one failed run must not lose the others
                import traceback

                result = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps({"index": index, "result": result}), flush=True)


def first_device(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The device the first run that reported one ran on."""
    return next((r["device"] for r in runs if "device" in r), None)


def emit(result: dict[str, Any]) -> None:
    """Print a worker's result as the last stdout line, with the device it ran on."""
    if "jax" in sys.modules and "device" not in result:
        result = {**result, "device": device_info()}
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------- results


def machine() -> dict[str, Any]:
    """The host and the software, read without importing JAX.

    A parent that imported JAX could hold the device its workers need (on a
    TPU, one process at a time); the backend and device come from a worker
    (`device_info`), merged in by `publish`.
    """
    from importlib import metadata

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    try:
        jax_version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        jax_version = "not installed"
    return {
        "python": platform.python_version(),
        "jax": jax_version,
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": load,
        "platform": platform.platform(),
        **_processor(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def device_info() -> dict[str, Any]:
    """The backend and devices this process computes on (imports JAX and opens
    the device: for workers and in-process benchmarks only)."""
    import jax

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "jax_runtime": jax.__version__,
    }


def expected_backend() -> str:
    """The backend JAX will pick here, guessed without importing it: `JAX_PLATFORMS`
    if set, else `tpu` or `gpu` when their plugin is installed, else `cpu`.

    Only for sizing runs before any worker has started; results are named
    after the backend the workers report.
    """
    import importlib.util

    platforms = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if platforms:
        return {"cuda": "gpu", "rocm": "gpu"}.get(platforms, platforms)
    if importlib.util.find_spec("libtpu") is not None:
        return "tpu"
    gpu_plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin")
    if any(importlib.util.find_spec(name) is not None for name in gpu_plugins):
        return "gpu"
    return "cpu"


def result_stem(name: str, backend: str) -> str:
    """The results file stem of `name` on `backend`.

    `{backend}` in `name` is replaced by the backend; otherwise results of an
    accelerator are prefixed with it (`tpu_compare_...`), so they never
    overwrite the CPU results committed under the plain name.
    """
    if "{backend}" in name:
        return name.replace("{backend}", backend)
    return name if backend == "cpu" else f"{backend}_{name}"


_VECTOR_ISAS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))


def _processor(cpuinfo: str | None = None) -> dict[str, str]:
    """The CPU's model name, family and model numbers and its widest vector
    instructions (from Linux's `/proc/cpuinfo`; elsewhere
    `platform.processor()` and "unknown").

    The benchmarks' ratios move with the processor: the same code's memory
    replay measured MinGRU 3.43x the LSTM on an Intel Xeon and 2.20x on an
    AMD EPYC, both with AVX-512, so every result names its processor. A
    virtual machine may name it only "AMD EPYC"; the family and model
    numbers tell its generation.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    isa = next((label for flag, label in _VECTOR_ISAS if flag in flags), None)
    family, model = fields.get("cpu family"), fields.get("model")
    return {
        "cpu": fields.get("model name") or platform.processor() or "unknown",
        "cpu_id": f"family {family} model {model}" if family and model else "",
        "vector_isa": isa or ("SSE" if flags else "unknown"),
    }


def hardware(m: dict[str, Any]) -> str:
    """Where a result ran, in words: `cores(m)` on a CPU backend, else the
    device ("1 x TPU v5 lite (tpu), host: 13 cores of ...")."""
    if m.get("backend", "cpu") == "cpu":
        return cores(m)
    return (
        f"{m.get('device_count', 1)} x {m.get('device_kind', 'unknown device')} "
        f"({m['backend']}), host: {cores(m)}"
    )


def cores(m: dict[str, Any]) -> str:
    """`m` (a result's `machine`) in words: "2 cores of AMD EPYC (family 25
    model 17, AVX-512)"; results written before the processor was recorded
    say "2 CPU cores"."""
    if "cpu" not in m:
        return f"{m['cpu_count']} CPU cores"
    details = [d for d in (m.get("cpu_id"), m["vector_isa"]) if d]
    if m.get("xla_flags"):
        details.append(f"XLA_FLAGS={m['xla_flags']}")
    return f"{m['cpu_count']} cores of {m['cpu']} ({', '.join(details)})"


def versions() -> dict[str, str]:
    from importlib import metadata

    root = ROOT
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            cwd=root,
        ).stdout.strip()
    except OSError:
        commit = ""
    # A copy of the checkout without its git folder (an accelerator host) is
    # named by EQX_PPO_COMMIT.
    commit = commit or os.environ.get("EQX_PPO_COMMIT", "unknown")
    out = {"eqx_ppo_commit": commit}
    packages = ("eqx_ppo", "jax", "jaxlib", "libtpu", "equinox", "optax", "brax")
    for name in (*packages, "flax", "rejax", "gymnax", "nnx-ppo"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def _fmt(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def alternated_medians_us(
    fns: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]], rounds: int
) -> dict[str, float]:
    """Median wall time (us) of each `fn(*args)`, after one warm-up call each.

    Every round calls each function once, in an order rotated per round, so
    machine noise hits all of them alike.
    """
    import jax

    for fn, args in fns.values():
        jax.block_until_ready(fn(*args))
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, args = fns[name]
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) * 1e6 for name, s in samples.items()}


def spread(values: list[float]) -> str:
    """`median [min-max]` of the finite values, readable."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    if len(values) == 1:
        return _fmt(values[0])
    lo, hi = min(values), max(values)
    return f"{_fmt(statistics.median(values))} [{_fmt(lo)}, {_fmt(hi)}]"


def publish(
    name: str,
    result: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    started: dict[str, Any],
) -> Path:
    """Stamp `result` with `started` (`machine()` read when the script began,
    so its load average is the machine's before the benchmark) and the
    device (`result["device"]`, from a worker; in a process that computed
    itself, `device_info()`), the package versions and the finish time; write
    `results/<stem>.json` and `results/<stem>.md` (the tables `render` makes
    of it; the stem is `result_stem(name, backend)`) and print the tables.
    Returns the path of the Markdown file.
    """
    device = result.get("device")
    if device is None:
        device = device_info() if "jax" in sys.modules else {"backend": "unknown"}
    result = {
        **result,
        "machine": {**started, **device},
        "versions": versions(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    text = render(result)
    stem = result_stem(name, device["backend"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    path = RESULTS / f"{stem}.md"
    path.write_text(text)
    print()
    print(text)
    print(f"written: {path} (+ .json)", flush=True)
    return path
