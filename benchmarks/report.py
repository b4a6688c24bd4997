"""Paste the latest result tables into `benchmarks/README.md`.

    python -m benchmarks.report

Replaces the text between the `<!-- results:start -->` and
`<!-- results:end -->` markers with `results/<name>.md` for every result file
that exists, in a fixed order, so the README always shows what the scripts
last measured.
"""

from pathlib import Path

from ._common import RESULTS

ORDER = (
    "compare_inverted_pendulum_mlp",
    "compare_move_to_center_mlp",
    "compare_move_to_center_lstm",
    "multiseed",
    "scaling",
)
START, END = "<!-- results:start -->", "<!-- results:end -->"


def main() -> None:
    readme = Path(__file__).resolve().parent / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} markers")
    parts = [
        (RESULTS / f"{name}.md").read_text().strip()
        for name in ORDER
        if (RESULTS / f"{name}.md").exists()
    ]
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    body = "\n\n".join(parts) if parts else "_No results yet._"
    readme.write_text(f"{head}{START}\n{body}\n{END}{tail}")
    print(f"updated {readme} with {len(parts)} result tables")


if __name__ == "__main__":
    main()
