"""The benchmarks on any backend, one command: a TPU, a GPU, or a CPU at toy sizes.

    python -m benchmarks.accelerator --part PART[,PART...]|all [--quick] [--reps 3]
        [--envs cartpole,inverted_pendulum] [--systems eqx,brax,rejax]
        [--scales small,large]
        [--budget-s 540] [--results DIR] [--dry-run]

Parts (comma-separated, or `all`):

- `compare`: eqx_ppo, Brax PPO and rejax on the built-in pure-JAX `cartpole`
  and Brax's `inverted_pendulum` (spring), at 2048 envs with 4x32 MLPs and
  8 minibatches and at 8192 envs with 4x256 MLPs and 32 minibatches (rollout
  20, 4 epochs, obs normalisation).
- `lstm`: eqx_ppo's LSTM(32) + 2x32 actor and critic against nnx-ppo 0.3.0's,
  `inverted_pendulum`, 2048 envs.
- `multiseed`: 64 seeds x 64 envs in one vmapped program against one
  4096-env run, `inverted_pendulum`.
- `memory`: the memory cells' replay (`benchmarks.memory --part replay`).
- `compile`: where compile time goes, cold and warm (`benchmarks.compile_time`).
- `seeds`: 2048 seeds of CartPole-v1 in one program (`benchmarks.seeds_at_scale`).
- `profile`: the per-op profile of one `ppo_step` (`benchmarks.profile`).
- `fusion` (not in `all`): the fused actor-critic forms at one 5120-row
  minibatch of 4x256 MLPs (`benchmarks.fusion`).

How it measures. This process never imports JAX (only one process can
hold a TPU); it plans, starts workers one at a time and writes the
results, named after the backend its first worker reports
(`results/tpu_compare_cartpole_2048_4x32.md`, `cpu_...` on a CPU). The
runs of `compare`, `lstm` and `multiseed` share one worker process
(opening a TPU costs about 15 s), with JAX's persistent compilation cache
in a new empty folder: each repetition runs every system once, in an order
rotated per repetition; repetition 0 compiles cold (its compile + first
chunk is the one reported), later ones reuse the compiled programs
(eqx_ppo and rejax in memory, Brax and nnx-ppo from the cache). Ratios are
paired per repetition. Each run lasts long enough for at least 5 s of
steady training of the fastest system (sized from throughputs measured on
the backend before, `RATES`); the shared evaluator scores repetition 0.
Sizes are per backend: accelerator sizes where JAX will find a TPU or a
GPU, toy sizes on a CPU or with `--quick`.

Before starting it prints the plan and its estimated duration; with
`--budget-s` (default 540 s at accelerator sizes) a run or part that would
end past the budget is skipped, and every result is written as soon as its
setting is complete, so a command killed at a time limit keeps what it
finished. `--results DIR` writes elsewhere (e.g. a folder an accelerator
host sends back).
"""

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _common
from ._common import (
    SYSTEM_NAMES,
    Spec,
    expected_backend,
    hardware,
    machine,
    median,
    publish,
    run_session,
    spread,
    worker_env,
)

PARTS = ("compare", "lstm", "multiseed", "memory", "compile", "seeds", "profile")
EXTRA_PARTS = ("fusion",)
"""Parts that `all` leaves out (they fit no device-time budget of the issue's)."""
TRAIN_PARTS = ("compare", "lstm", "multiseed")
COMPARE_ENVS = ("cartpole", "inverted_pendulum")
COMPARE_SYSTEMS = ("eqx", "brax", "rejax")
STEADY_S = 5.5
"""Seconds of steady training the fastest system of a setting gets (>= 5)."""
DEVICE_OPEN_S = 35.0
"""A worker's start: opening the device (about 15 s on a TPU), imports, warm-up."""

RATES: dict[tuple[str, int, int], dict[str, float]] = {
    ("cartpole", 2048, 32): {"eqx": 18.0e6, "brax": 16.5e6, "rejax": 4.7e6},
    ("cartpole", 8192, 256): {"eqx": 5.0e6, "brax": 6.0e6, "rejax": 3.0e6},
    ("inverted_pendulum", 2048, 32): {"eqx": 9.5e6, "brax": 7.5e6, "rejax": 3.5e6},
    ("inverted_pendulum", 8192, 256): {"eqx": 4.2e6, "brax": 5.0e6, "rejax": 2.4e6},
    ("lstm", 2048, 32): {"eqx": 4.5e6, "nnx": 2.2e6},
    ("multiseed", 4096, 32): {"vmapped": 10.0e6, "single": 13.1e6},
}
"""Steady env-steps/s on one TPU v5e chip (issue 40's first side-by-side run;
the 8192-env cart-pole and rejax's 2048-env pendulum guessed): sizes the runs
and the estimate, at accelerator sizes only."""
COMPILE_S = {"eqx": 40.0, "brax": 35.0, "rejax": 35.0, "nnx": 40.0}
"""Cold compile + first chunk on a TPU (s), for the estimate; warm repetitions
retrace (Brax, nnx-ppo) or reuse the program (`WARM_S`)."""
WARM_S = {"eqx": 1.0, "brax": 6.0, "rejax": 1.0, "nnx": 6.0}
EVAL_S = 8.0


@dataclasses.dataclass(frozen=True)
class Setting:
    """One side-by-side table: its results stem, part, and the run of each
    variant (a system, or a multi-seed layout) by label."""

    stem: str
    part: str
    title: str
    variants: dict[str, Spec]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that depends on the backend: run sizes and time guesses."""

    accelerator: bool

    def compare(self, env: str, large: bool) -> Spec:
        if self.accelerator:
            n, width, minibatches = (8192, 256, 32) if large else (2048, 32, 8)
        else:
            n, width, minibatches = (64, 16, 32) if large else (32, 8, 8)
        return self._sized(
            Spec(
                env=env,
                n_envs=n,
                hidden=(width,) * 4,
                n_minibatches=minibatches,
            ),
            (env, n, width),
        )

    def lstm(self) -> Spec:
        n, size = (2048, 32) if self.accelerator else (32, 8)
        spec = Spec(
            env="inverted_pendulum" if self.accelerator else "cartpole",
            policy="lstm",
            n_envs=n,
            lstm_size=size,
            hidden=(size, size),
        )
        return self._sized(spec, ("lstm", n, size))

    def multiseed(self) -> tuple[Spec, Spec]:
        seeds, per_seed = (64, 64) if self.accelerator else (4, 8)
        env = "inverted_pendulum" if self.accelerator else "cartpole"
        single = self._sized(
            Spec(env=env, n_envs=seeds * per_seed, evaluate=False),
            ("multiseed", seeds * per_seed, 32),
        )
        vmapped = dataclasses.replace(
            single,
            n_envs=per_seed,
            n_seeds=seeds,
            total_steps=single.run_steps // seeds,
        )
        return vmapped, single

    def _sized(
        self, spec: Spec, key: tuple[str, int, int], label: str | None = None
    ) -> Spec:
        """`spec` with enough steps for `STEADY_S` of steady training of the
        fastest system (accelerator; of `label` if given), or three
        one-iteration chunks (toy)."""
        per_iteration = spec.n_envs * spec.rollout_length
        if not self.accelerator:
            return dataclasses.replace(
                spec, total_steps=3 * per_iteration, n_chunks=3, eval_envs=8
            )
        rate = RATES[key][label] if label else max(RATES[key].values())
        per_chunk = -(-int(rate * STEADY_S) // ((spec.n_chunks - 1) * per_iteration))
        return dataclasses.replace(
            spec, total_steps=per_chunk * spec.n_chunks * per_iteration
        )

    def own_length(self, spec: Spec) -> Spec:
        """A compare run sized for `STEADY_S` at its own system's rate: rejax
        (its whole run one compiled program, so its steady rate does not
        depend on the run's length) trains for fewer steps than the others."""
        return self._sized(spec, (spec.env, spec.n_envs, spec.hidden[0]), spec.system)

    def run_s(self, key: tuple[str, int, int] | None, label: str, spec: Spec) -> float:
        """The guessed seconds of one run's training, compilation apart."""
        if not self.accelerator or key is None:
            return 2.0
        rate = RATES[key].get(label, min(RATES[key].values()))
        return spec.run_steps * spec.n_seeds / rate

    def compile_s(self, system: str, cold: bool) -> float:
        if not self.accelerator:
            return 15.0 if cold else 2.0
        return COMPILE_S[system] if cold else WARM_S[system]


def settings(
    parts: list[str],
    sizes: Sizes,
    envs: list[str],
    systems: list[str],
    scales: tuple[str, ...] = ("small", "large"),
) -> list[Setting]:
    """The side-by-side settings of the training parts among `parts`; the
    compare part's at the `scales` asked for (small: 2048 envs, 4x32; large:
    8192 envs, 4x256)."""
    out = []
    if "compare" in parts:
        for env in envs:
            for large in [scale == "large" for scale in scales]:
                base = sizes.compare(env, large)
                width = base.hidden[0]
                stem = f"compare_{env}_{base.n_envs}_4x{width}"
                title = (
                    f"`{env}`, {base.n_envs} envs, 4x{width} MLPs, "
                    f"{base.n_minibatches} minibatches"
                )
                variants = {
                    s: dataclasses.replace(base, system=s, evaluate=not large)
                    for s in systems
                    if s in COMPARE_SYSTEMS
                }
                if "rejax" in variants:
                    variants["rejax"] = sizes.own_length(variants["rejax"])
                out.append(Setting(stem, "compare", title, variants))
    if "lstm" in parts:
        base = sizes.lstm()
        variants = {s: dataclasses.replace(base, system=s) for s in ("eqx", "nnx")}
        title = (
            f"`{base.env}`, {base.n_envs} envs, LSTM({base.lstm_size}) + "
            f"{len(base.hidden)}x{base.hidden[0]} actor and critic"
        )
        out.append(Setting(f"compare_{base.env}_lstm", "lstm", title, variants))
    if "multiseed" in parts:
        vmapped, single = sizes.multiseed()
        title = (
            f"`{single.env}`, {vmapped.n_seeds} seeds x {vmapped.n_envs} envs in "
            f"one program vs one {single.n_envs}-env run"
        )
        out.append(
            Setting(
                "multiseed", "multiseed", title, {"vmapped": vmapped, "single": single}
            )
        )
    return out


def _rate_key(setting: Setting) -> tuple[str, int, int] | None:
    spec = next(iter(setting.variants.values()))
    if setting.part == "compare":
        return spec.env, spec.n_envs, spec.hidden[0]
    if setting.part == "lstm":
        return "lstm", spec.n_envs, spec.lstm_size
    return "multiseed", spec.n_envs * spec.n_seeds, 32


def rotation(labels: list[str], rep: int) -> list[str]:
    """`labels` in repetition `rep`'s order: rotated by `rep`, so no system
    always runs first or last."""
    shift = rep % len(labels)
    return labels[shift:] + labels[:shift]


def session_items(setting_list: list[Setting], reps: int, sizes: Sizes) -> list[dict]:
    """Every run of the training parts, setting by setting, each repetition's
    systems in a rotated order (starting from another system in each
    setting, so no system always compiles first); the shared evaluator
    scores repetition 0.
    Each item carries its setting, label, repetition and estimated seconds."""
    items = []
    for index, setting in enumerate(setting_list):
        labels = list(setting.variants)
        key = _rate_key(setting)
        for rep in range(reps):
            for label in rotation(labels, index + rep):
                spec = setting.variants[label]
                spec = dataclasses.replace(
                    spec, seed=rep, evaluate=spec.evaluate and rep == 0
                )
                estimate = (
                    sizes.compile_s(spec.system, cold=rep == 0)
                    + sizes.run_s(key, label, spec)
                    + (EVAL_S if spec.evaluate and sizes.accelerator else 0.0)
                )
                items.append(
                    {
                        "spec": spec.to_json(),
                        "setting": setting.stem,
                        "label": label,
                        "rep": rep,
                        "estimate_s": round(estimate, 1),
                    }
                )
    return items


MEMORY_NETWORKS = "lstm,gru,lru,mingru,lru:scan,mingru:scan,mlp"
MEMORY_ROUNDS = 5


def memory_command(sizes: Sizes) -> list[str]:
    """The memory replay part: every cell at T = 16, 64, 256, the linear
    recurrences on both replay paths (plain `lru` and `mingru` take the
    backend's default), 5 rounds of 16 updates per timed call."""
    command = ["-m", "benchmarks.memory", "--part", "replay"]
    command += ["--name", "{backend}_memory"]
    if not sizes.accelerator:
        return [*command, "--quick"]
    return [*command, "--networks", MEMORY_NETWORKS, "--rounds", str(MEMORY_ROUNDS)]


def memory_estimate_s(sizes: Sizes) -> float:
    """Compiles, then a warm-up call and the rounds of every timed call, at the
    cost issue 40 measured on a TPU before the categorical sampler's fix
    (2.3 ms per time step per call of 16 updates, whatever the cell)."""
    if not sizes.accelerator:
        return 60.0
    networks = len(MEMORY_NETWORKS.split(","))
    per_round = networks * sum(t * 2.3e-3 for t in (16, 64, 256))
    return DEVICE_OPEN_S + networks * 3 * 6.0 + (MEMORY_ROUNDS + 1) * per_round


def compile_env(sizes: Sizes) -> str:
    """The compile part's env: Brax's pendulum (the larger compile) on an
    accelerator, the built-in cart-pole at toy sizes."""
    return "inverted_pendulum" if sizes.accelerator else "cartpole"


PROFILE_ENV, PROFILE_N_ENVS = "inverted_pendulum", 2048


def profile_command(sizes: Sizes) -> list[str]:
    """One `ppo_step`'s per-op profile at the compare part's 2048-env setting."""
    n_envs = PROFILE_N_ENVS if sizes.accelerator else 32
    env = PROFILE_ENV if sizes.accelerator else "move_to_center"
    return [
        "-m",
        "benchmarks.profile",
        "--env",
        env,
        "--part",
        "ppo_step",
        "--n-envs",
        str(n_envs),
        "--name",
        f"{{backend}}_profile_{env}_mlp_ppo_step_1x{n_envs}",
    ]


def fusion_command(sizes: Sizes) -> list[str]:
    """The fused actor-critic forms at one minibatch of the compare part's
    8192-env setting (8192 envs x 20 steps / 32 minibatches), 4x256 MLPs."""
    rows, hidden, rounds = (
        (5120, "256,256,256,256", 100) if sizes.accelerator else (64, "8,8", 5)
    )
    return [
        "-m",
        "benchmarks.fusion",
        "--rows",
        str(rows),
        "--hidden",
        hidden,
        "--rounds",
        str(rounds),
        "--name",
        "{backend}_fusion",
    ]


def part_estimates(
    parts: list[str], items: list[dict], sizes: Sizes, seeds_settings: Any
) -> dict[str, float]:
    """Guessed seconds per part (the training parts together, one worker)."""
    from . import compile_time, seeds_at_scale

    out: dict[str, float] = {}
    if items:
        out["+".join(p for p in parts if p in TRAIN_PARTS)] = DEVICE_OPEN_S + sum(
            item["estimate_s"] for item in items
        )
    if "memory" in parts:
        out["memory"] = memory_estimate_s(sizes)
    if "compile" in parts:
        spec = compile_time.default_spec(compile_env(sizes), not sizes.accelerator)
        cold = sum(sizes.compile_s(s, True) for s in ("eqx", "brax")) + 10.0
        warm = sum(sizes.compile_s(s, False) for s in ("eqx", "brax")) + 15.0
        out["compile"] = (
            2 * DEVICE_OPEN_S + cold + warm + 2 * sizes.run_s(None, "", spec)
        )
    if "seeds" in parts:
        backend = "tpu" if sizes.accelerator else "cpu"
        out["seeds"] = seeds_at_scale.estimate_s(seeds_settings, backend)
    if "profile" in parts:
        out["profile"] = DEVICE_OPEN_S + (45.0 if sizes.accelerator else 20.0)
    if "fusion" in parts:
        out["fusion"] = DEVICE_OPEN_S + (30.0 if sizes.accelerator else 10.0)
    return out


# ------------------------------------------------------------------- results


def summarise(setting: Setting, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: steady throughput over repetitions, compile + first chunk
    cold (repetition 0) and warm (the others), final return (repetition 0);
    and eqx_ppo's (or the vmapped run's) throughput over each other
    variant's, paired per repetition."""
    labels = list(setting.variants)
    ok = [r for r in runs if "error" not in r]
    per: dict[str, Any] = {}
    for label in labels:
        mine = [r for r in ok if r["label"] == label]
        per[label] = {
            "sps": [r["sps"] for r in mine],
            "compile_cold_s": [r["compile_s"] for r in mine if r["rep"] == 0],
            "compile_warm_s": [r["compile_s"] for r in mine if r["rep"] > 0],
            "eval_return": [r["eval_return"] for r in mine if "eval_return" in r],
            "end_to_end_sps": [r["steps"] / r["train_wall_s"] for r in mine],
        }
    reference = labels[0]
    ratios = {}
    for other in labels[1:]:
        paired = []
        for rep in sorted({r["rep"] for r in ok}):
            a = [r for r in ok if r["rep"] == rep and r["label"] == reference]
            b = [r for r in ok if r["rep"] == rep and r["label"] == other]
            if a and b:
                paired.append(a[0]["sps"] / b[0]["sps"])
        ratios[other] = paired
    return {"variants": per, "reference": reference, "paired_ratios": ratios}


LABELS = {
    **SYSTEM_NAMES,
    "vmapped": "seeds vmapped in one program",
    "single": "one run of as many envs",
}


def markdown(result: dict[str, Any]) -> str:
    spec, summary, m = result["spec"], result["summary"], result["machine"]
    reps = result["reps"]
    network = (
        f"{len(spec['hidden'])}x{spec['hidden'][0]} swish MLPs"
        if spec["policy"] == "mlp"
        else f"LSTM({spec['lstm_size']}) + {len(spec['hidden'])}x{spec['hidden'][0]} "
        "swish actor and critic"
    )
    steps = Spec.from_dict(spec).run_steps * spec["n_seeds"]
    lines = [
        f"### {result['title']}",
        "",
        f"Rollout {spec['rollout_length']}, {spec['n_minibatches']} minibatches, "
        f"{spec['n_epochs']} epochs, {network}, obs normalisation; {steps:,} env "
        f"steps per run in {spec['n_chunks']} chunks; {reps} repetitions in one "
        "worker process, the systems' order rotated per repetition; median "
        f"[min-max]. JAX {m['jax']} on {hardware(m)}.",
        "",
        "| system | steady env-steps/s | compile + first chunk, cold (s) "
        "| later repetitions (s) | final deterministic return (rep. 0) |",
        "|---|---|---|---|---|",
    ]
    for label, s in summary["variants"].items():
        if not s["sps"]:
            lines.append(f"| {LABELS[label]} | failed | | | |")
            continue
        lines.append(
            f"| {LABELS[label]} | {spread(s['sps'])} | {spread(s['compile_cold_s'])} "
            f"| {spread(s['compile_warm_s'])} | {spread(s['eval_return'])} |"
        )
    lines.append("")
    reference = LABELS[summary["reference"]]
    for other, paired in summary["paired_ratios"].items():
        if paired:
            lines.append(
                f"- paired throughput ratio {reference} / {LABELS[other]}: "
                f"**{spread(paired)}** (per repetition: "
                f"{', '.join(f'{p:.2f}' for p in paired)})"
            )
    cold = {k: v["compile_cold_s"] for k, v in summary["variants"].items()}
    ref = summary["reference"]
    for other in summary["paired_ratios"]:
        if cold.get(ref) and cold.get(other):
            lines.append(
                f"- compile + first chunk, cold, {reference} / {LABELS[other]}: "
                f"{median(cold[ref]) / median(cold[other]):.2f}"
            )
    errors = [r for r in result["runs"] if "error" in r]
    for r in errors:
        lines.append(f"- rep {r['rep']} {LABELS[r['label']]}: {r['error'][-300:]}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- main


class Command:
    """One invocation: the plan, the deadline, the results written so far."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.parts = list(PARTS) if args.part == "all" else args.part.split(",")
        unknown = set(self.parts) - set(PARTS) - set(EXTRA_PARTS)
        if unknown:
            raise SystemExit(
                f"unknown part(s) {sorted(unknown)}; choose from {PARTS + EXTRA_PARTS}"
            )
        self.planned = expected_backend()
        self.sizes = Sizes(accelerator=self.planned != "cpu" and not args.quick)
        self.settings = settings(
            self.parts,
            self.sizes,
            args.envs.split(","),
            args.systems.split(","),
            tuple(args.scales.split(",")),
        )
        self.items = session_items(self.settings, args.reps, self.sizes)
        from .seeds_at_scale import QUICK, Settings

        self.seeds_settings = (
            Settings() if self.sizes.accelerator else Settings(**QUICK)
        )
        self.estimates = part_estimates(
            self.parts, self.items, self.sizes, self.seeds_settings
        )
        budget = args.budget_s
        if budget is None and self.sizes.accelerator:
            budget = 540.0
        self.budget = budget
        self.started = machine()
        self.t0 = time.time()
        self.written: list[Path] = []
        self.backend: str | None = None

    @property
    def deadline(self) -> float | None:
        return None if self.budget is None else self.t0 + self.budget

    def describe(self) -> str:
        sizes = "accelerator" if self.sizes.accelerator else "toy (CPU or --quick)"
        lines = [
            f"accelerator: parts {','.join(self.parts)}; JAX should find "
            f"'{self.planned}' here: {sizes} sizes; {self.args.reps} repetitions",
        ]
        for setting in self.settings:
            steps = ", ".join(
                f"{label} {spec.run_steps * spec.n_seeds:,}"
                for label, spec in setting.variants.items()
            )
            lines.append(f"  {setting.stem}: env steps per run: {steps}")
        total = sum(self.estimates.values())
        lines.append(
            "  estimated: "
            + ", ".join(f"{k} {v / 60:.1f} min" for k, v in self.estimates.items())
            + f"; total {total / 60:.1f} min"
        )
        if self.budget is not None:
            lines.append(
                f"  budget {self.budget:.0f} s: later runs are skipped past it"
            )
            if total > self.budget:
                lines.append(
                    "  WARNING: the estimate exceeds the budget; split the parts "
                    "over several commands"
                )
        return "\n".join(lines)

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def check_device(self, device: dict[str, Any]) -> None:
        """Stop if the workers compute elsewhere than planned: accelerator
        sizes on a CPU would run for hours, toy sizes on an accelerator
        measure nothing."""
        backend = device["backend"]
        self.backend = self.backend or backend
        if self.sizes.accelerator and backend == "cpu":
            raise SystemExit(
                f"the worker runs on a CPU, but '{self.planned}' was expected "
                "(does another process hold the device?); use --quick on a CPU"
            )
        if not self.sizes.accelerator and not self.args.quick and backend != "cpu":
            raise SystemExit(
                f"the worker found a {backend}, but no accelerator was seen here "
                f"(no libtpu or GPU plugin found): rerun with JAX_PLATFORMS={backend}"
            )

    def run_training(self) -> None:
        if not self.items:
            return
        cache = tempfile.mkdtemp(prefix="eqx_ppo-bench-cache-")
        done: dict[str, list[dict[str, Any]]] = {s.stem: [] for s in self.settings}
        by_stem = {s.stem: s for s in self.settings}
        per_setting = {
            s.stem: sum(1 for i in self.items if i["setting"] == s.stem)
            for s in self.settings
        }

        def on_result(index: int, result: dict[str, Any]) -> None:
            item = self.items[index]
            run = {**result, "label": item["label"], "rep": item["rep"]}
            _log_run(item, run)
            done[item["setting"]].append(run)
            if len(done[item["setting"]]) == per_setting[item["setting"]]:
                self.publish_setting(by_stem[item["setting"]], done[item["setting"]])

        try:
            run_session(
                self.items,
                env=worker_env(
                    {
                        "JAX_COMPILATION_CACHE_DIR": cache,
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
                    }
                ),
                deadline=self.deadline,
                on_ready=self.check_device,
                on_result=on_result,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    def publish_setting(self, setting: Setting, runs: list[dict[str, Any]]) -> None:
        spec = next(iter(setting.variants.values()))
        device = next((r["device"] for r in runs if r.get("device")), None)
        result = {
            "title": setting.title,
            "part": setting.part,
            "spec": dataclasses.asdict(spec),
            "variants": {k: dataclasses.asdict(v) for k, v in setting.variants.items()},
            "reps": self.args.reps,
            "runs": runs,
            "summary": summarise(setting, runs),
            "device": device or {"backend": "unknown"},
        }
        self.written.append(
            publish(f"{{backend}}_{setting.stem}", result, markdown, self.started)
        )

    def run_script(self, part: str, command: list[str]) -> None:
        """A part that runs in one process of its own (memory, profile)."""
        env = worker_env({"EQX_PPO_BENCH_RESULTS": str(_common.RESULTS)})
        code = subprocess.run([sys.executable, *command], cwd=_common.ROOT, env=env)
        if code.returncode != 0:
            print(f"  {part}: exited {code.returncode}", flush=True)

    def run_part(self, part: str) -> None:
        estimate = self.estimates.get(part, 0.0)
        if estimate > self.remaining():
            print(
                f"{part}: skipped, its estimated {estimate:.0f} s would end past "
                "the budget",
                flush=True,
            )
            return
        print(f"{part}: started (estimated {estimate:.0f} s)", flush=True)
        if part == "memory":
            self.run_script(part, memory_command(self.sizes))
        elif part == "profile":
            self.run_script(part, profile_command(self.sizes))
        elif part == "fusion":
            self.run_script(part, fusion_command(self.sizes))
        elif part == "compile":
            from . import compile_time

            env = compile_env(self.sizes)
            spec = compile_time.default_spec(env, not self.sizes.accelerator)
            result = compile_time.run(spec, deadline=self.deadline)
            self.written.append(
                publish(
                    f"{{backend}}_compile_{env}",
                    result,
                    compile_time.markdown,
                    self.started,
                )
            )
        elif part == "seeds":
            from . import seeds_at_scale

            result = seeds_at_scale.run(self.seeds_settings, deadline=self.deadline)
            self.written.append(
                publish(
                    "{backend}_seeds_at_scale",
                    result,
                    seeds_at_scale.markdown,
                    self.started,
                )
            )

    def run(self) -> None:
        train = [p for p in self.parts if p in TRAIN_PARTS]
        if train:
            print(f"{'+'.join(train)}: started", flush=True)
            self.run_training()
        for part in self.parts:
            if part not in TRAIN_PARTS:
                self.run_part(part)
        print(f"accelerator: done in {time.time() - self.t0:.0f} s", flush=True)


def _log_run(item: dict[str, Any], run: dict[str, Any]) -> None:
    where = f"  {item['setting']} rep {item['rep']} {item['label']:8s}"
    if "error" in run:
        print(f"{where}: ERROR {run['error'][-400:]}", flush=True)
        return
    ret = run.get("eval_return")
    print(
        f"{where}: {run['sps']:12,.0f} steps/s, compile + first chunk "
        f"{run['compile_s']:5.1f} s, run {run['run_wall_s']:5.1f} s"
        + ("" if ret is None else f", return {ret:.1f}"),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", default="all", help=f"{','.join(PARTS + EXTRA_PARTS)} or all"
    )
    parser.add_argument("--quick", action="store_true", help="toy sizes on any backend")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--envs", default=",".join(COMPARE_ENVS))
    parser.add_argument(
        "--systems", default=",".join(COMPARE_SYSTEMS), help="of the compare part"
    )
    parser.add_argument(
        "--scales",
        default="small,large",
        help="of the compare part: small (2048 envs, 4x32), large (8192, 4x256)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip what would end past it (default 540 at accelerator sizes)",
    )
    parser.add_argument("--results", default=None, help="write results here")
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.results:
        _common.RESULTS = Path(args.results).resolve()
        os.environ["EQX_PPO_BENCH_RESULTS"] = str(_common.RESULTS)
    command = Command(args)
    print(command.describe(), flush=True)
    if args.dry_run:
        return
    command.run()


if __name__ == "__main__":
    main()
