"""Paste the latest results into `benchmarks/README.md` and the top-level README.

    python -m benchmarks.report

In `benchmarks/README.md`, replaces the text between `<!-- results:start -->`
and `<!-- results:end -->` with `results/<name>.md` for every result file that
exists, in a fixed order, and between `<!-- profile:start -->` and
`<!-- profile:end -->` every `results/profile_*.md` (`benchmarks.profile`). In
`README.md`, replaces the text between
`<!-- benchmarks:start -->` and `<!-- benchmarks:end -->` with a summary built
from the JSON results: the `inverted_pendulum` table and the paired ratios of
every comparison. Both READMEs then show what the scripts last measured.
"""

import json
from pathlib import Path
from typing import Any

from ._common import RESULTS, SYSTEM_NAMES, median, spread
from .multiseed import _paired

ORDER = (
    "compare_inverted_pendulum_mlp",
    "compare_move_to_center_mlp",
    "compare_move_to_center_lstm",
    "multiseed",
    "scaling",
    "stability_before",
    "stability_after",
    "quality_cartpole",
    "guards_move_to_center",
    "fusion",
    "layout",
)
HERE = Path(__file__).resolve().parent


def _replace(path: Path, start: str, end: str, body: str) -> None:
    text = path.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} markers")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{start}\n{body}\n{end}{tail}")


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _ratios(result: dict[str, Any]) -> str:
    return ", ".join(
        f"eqx_ppo / {SYSTEM_NAMES[other]} **{median(paired):.2f}**"
        for other, paired in result["summary"]["eqx_over"].items()
        if paired
    )


def summary() -> str:
    """The top-level README's benchmark section, from the JSON results."""
    lines = []
    pendulum = _load("compare_inverted_pendulum_mlp")
    if pendulum is not None:
        lines += [
            "| system | steady env-steps/s | compile + first chunk (s) "
            "| peak RSS (MiB) | final eval return |",
            "|---|---|---|---|---|",
        ]
        for system in pendulum["systems"]:
            s = pendulum["summary"][system]
            if not s.get("sps"):
                continue
            lines.append(
                f"| {SYSTEM_NAMES[system]} | {spread(s['sps'])} "
                f"| {spread(s['compile_s'])} | {median(s['peak_rss_mb']):,.0f} "
                f"| {spread(s.get('eval_return', []))} |"
            )
        lines += ["", "Paired throughput ratios (median over repetitions):", ""]
    for name, label in (
        ("compare_inverted_pendulum_mlp", "`inverted_pendulum`, 4x32 MLP"),
        ("compare_move_to_center_mlp", "`move_to_center`, 4x32 MLP"),
        ("compare_move_to_center_lstm", "`move_to_center`, LSTM(32) + 2x32 MLP"),
    ):
        result = _load(name)
        if result is not None:
            lines.append(f"- {label}: {_ratios(result)}")
    multiseed = _load("multiseed")
    if multiseed is not None:
        runs, s = multiseed["runs"], multiseed["seeds"]
        lines.append(
            f"- {s} seeds x {multiseed['envs_per_seed']} envs in one vmapped "
            f"program: **{median(_paired(runs, 'vmapped', 'single', 'sps')):.2f}**"
            f" of one {s * multiseed['envs_per_seed']}-env run's throughput, "
            f"{median(_paired(runs, 'vmapped', 'sequential', 'sps')):.2f}x "
            f"{s} sequential runs (end to end, compilation included: "
            f"{median(_paired(runs, 'vmapped', 'sequential', 'end_to_end_sps')):.2f}x)"
        )
    return "\n".join(lines) if lines else "_No results yet._"


def main() -> None:
    parts = [
        (RESULTS / f"{name}.md").read_text().strip()
        for name in ORDER
        if (RESULTS / f"{name}.md").exists()
    ]
    body = "\n\n".join(parts) if parts else "_No results yet._"
    _replace(HERE / "README.md", "<!-- results:start -->", "<!-- results:end -->", body)
    profiles = [p.read_text().strip() for p in sorted(RESULTS.glob("profile_*.md"))]
    _replace(
        HERE / "README.md",
        "<!-- profile:start -->",
        "<!-- profile:end -->",
        "\n\n".join(profiles) if profiles else "_No profiles yet._",
    )
    _replace(
        HERE.parent / "README.md",
        "<!-- benchmarks:start -->",
        "<!-- benchmarks:end -->",
        summary(),
    )
    print(
        f"updated {HERE / 'README.md'} ({len(parts)} tables, {len(profiles)} "
        "profiles) and README.md"
    )


if __name__ == "__main__":
    main()
