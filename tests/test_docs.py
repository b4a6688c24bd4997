"""Runs the Python code of the documentation pages, `docs/*.md` and
`docs/guides/*.md`, and of the repository's `README.md`.

The ```python blocks of a page run in page order in one fresh interpreter (a
subprocess per page) whose working directory is an empty temporary folder:
later blocks see the names of earlier ones, and pages share no state. A page's
test fails when a block raises or a checked output differs; the message names
the page and the line.

Documentation code is tested
----------------------------

- Only ```python blocks run. ```py blocks are displayed but never run (use
  them for fragments and for other libraries' code); ```bash, ```text and
  the rest never run.
- `<!-- docs-test: skip (reason) -->` on the line directly before a ```python
  fence excludes that block. The reason is mandatory: the block needs
  something CI lacks (a GPU, a cluster, credentials, a download).
- `print(...)  # expected` checks what that call prints, each time it runs
  (it must run at least once); the comment is the one on the line where the
  call ends or, when that line has none, the run of comment-only lines
  directly below the call, read as one comment (so a long output may wrap
  over several lines). Keep a blank line between a `print` and a comment
  below it that is not its output. Output and comment are compared token
  by token, ignoring whitespace: numbers match within
  `math.isclose(rel_tol=1e-2, abs_tol=1e-2)`, the looser of 1 % and 0.01
  (enough for a comment that rounds a float32), integers (shapes, steps)
  exactly, any other token exactly, and `...` matches any run of tokens. A
  colon after the complete output starts an explanation:
  `# (3, 4): evaluations x seeds`.
- Results of training differ between machines, so claim a bound instead:
  `# > -3.0`, `# < 1.8` or `# between 4.5 and 5.0` must hold for every number
  the call prints (at least one), whatever the other text; an explanation may
  follow after a colon.
- A ```text block after a ```python block in the same section (prose may lie
  between them, but no other block and no heading) is that block's whole
  printed output, compared line by line by the same rules.
"""

import ast
import contextlib
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import tokenize
import traceback
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS.parent / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md")), *sorted(DOCS.glob("guides/*.md"))]
# Pages that train (20-70 s each on two shared CPU cores) run with `pytest -m
# slow`, which CI runs too. The default suite keeps the README, the tutorial and
# the migration guide; `index.md` trains the README's example again.
SLOW_PAGES = {
    "concepts.md",
    "faq.md",
    "index.md",
    "guides/analysis.md",
    "guides/checkpointing.md",
    "guides/custom-layer.md",
    "guides/custom-learner.md",
    "guides/distillation.md",
    "guides/environments.md",
    "guides/logging.md",
    "guides/memory-models.md",
    "guides/multi-device.md",
    "guides/multi-seed.md",
    "guides/population-graphs.md",
    "guides/pytrees.md",
    "guides/recording.md",
    "guides/recurrent.md",
}
TIMEOUT_S = 1200

REL_TOL = ABS_TOL = 1e-2
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
INTEGER = r"[-+]?\d+"
TOKEN = re.compile(rf"\.\.\.|(?<![\w.]){NUMBER}(?![\w.])|\w+|\S")
BOUND = re.compile(
    rf"(?:(?P<op>[<>])\s*(?P<x>{NUMBER})"
    rf"|between\s+(?P<lo>{NUMBER})\s+and\s+(?P<hi>{NUMBER}))\s*(?::.*)?",
    re.DOTALL,
)
FENCE = re.compile(r"\s*```(?P<lang>[\w-]*).*")
MARKER = re.compile(r"\s*<!--\s*docs-test")
SKIP = re.compile(r"\s*<!-- docs-test: skip \((?P<reason>.*\S.*)\) -->\s*")
BLOCK_START = "--- docs-test: block at line {} ---"


@dataclasses.dataclass
class Block:
    """A fenced block of a page."""

    lang: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None = None  # the reason given by a skip marker
    output: "Block | None" = None  # the ```text block showing what it prints


def parse_page(text: str) -> list[Block]:
    """The page's ```python blocks, with their skip reasons and output blocks."""
    lines = text.splitlines()
    blocks, previous, skip, i = [], None, None, 0
    while i < len(lines):
        line, fence = lines[i], FENCE.fullmatch(lines[i])
        if MARKER.match(line):
            marker = SKIP.fullmatch(line)
            following = FENCE.fullmatch(lines[i + 1]) if i + 1 < len(lines) else None
            if marker is None or following is None or following["lang"] != "python":
                raise ValueError(
                    f"line {i + 1}: write `<!-- docs-test: skip (reason) -->` "
                    "on the line directly before a ```python fence"
                )
            skip = marker["reason"]
        elif line.startswith("#"):
            previous = None  # a heading: a ```text block below it is no output
        elif fence is not None:
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"),
                len(lines),
            )
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            block = Block(fence["lang"], i + 1, code, skip)
            if block.lang == "text" and previous and previous.lang == "python":
                previous.output = block
            if block.lang == "python":
                blocks.append(block)
            previous, skip, i = block, None, end
        i += 1
    return blocks


def instrument(block: Block) -> tuple[str, dict[int, str]]:
    """The block's code, padded to the page's line numbers, with every checked
    `print` recording what it prints; and the expected comments by line."""
    code = "\n" * block.line + block.code
    inline, alone = {}, {}  # comments after code, and comment-only lines
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            after_code = bool(token.line[: token.start[1]].strip())
            (inline if after_code else alone)[token.start[0]] = token.string[1:].strip()

    def comment(end: int) -> str:
        """The comment of a call ending on line `end`: its own or the lines below."""
        if end in inline:
            return inline[end]
        below = itertools.takewhile(lambda n: n in alone, itertools.count(end + 1))
        return " ".join(alone[n] for n in below)

    calls = [
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and comment(node.end_lineno)
    ]
    lines = [line.encode() for line in code.split("\n")]  # AST columns are bytes
    # Right to left, so that the columns of earlier calls on a line stay valid.
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset), reverse=True):
        name, line = call.func, lines[call.func.lineno - 1]
        recorder = f"__docs_print__({call.end_lineno})".encode()
        lines[name.lineno - 1] = (
            line[: name.col_offset] + recorder + line[name.end_col_offset :]
        )
    expected = {call.end_lineno: comment(call.end_lineno) for call in calls}
    return b"\n".join(lines).decode(), expected


def _tokens_equal(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    if not (re.fullmatch(NUMBER, actual) and re.fullmatch(NUMBER, expected)):
        return False
    if re.fullmatch(INTEGER, actual) and re.fullmatch(INTEGER, expected):
        return int(actual) == int(expected)
    return math.isclose(
        float(actual), float(expected), rel_tol=REL_TOL, abs_tol=ABS_TOL
    )


def matches(actual: str, expected: str) -> bool:
    """Whether the printed text satisfies the expected comment (see the module
    docstring)."""
    bound = BOUND.fullmatch(expected.strip())
    if bound is not None:
        numbers = [float(t) for t in TOKEN.findall(actual) if re.fullmatch(NUMBER, t)]
        if bound["op"] == ">":
            holds = [x > float(bound["x"]) for x in numbers]
        elif bound["op"] == "<":
            holds = [x < float(bound["x"]) for x in numbers]
        else:
            holds = [float(bound["lo"]) <= x <= float(bound["hi"]) for x in numbers]
        return bool(holds) and all(holds)

    got, want = TOKEN.findall(actual), TOKEN.findall(expected)

    @functools.cache
    def match(i: int, j: int) -> bool:  # got[i:] against want[j:]
        if j < len(want) and want[j] == "...":
            return any(match(k, j + 1) for k in range(i, len(got) + 1))
        if i == len(got):
            return j == len(want) or want[j] == ":"
        return j < len(want) and _tokens_equal(got[i], want[j]) and match(i + 1, j + 1)

    return match(0, 0)


def _output_matches(actual: str, expected: str) -> bool:
    got, want = actual.rstrip("\n").split("\n"), expected.rstrip("\n").split("\n")
    return len(got) == len(want) and all(map(matches, got, want))


def _name(page: Path) -> str:
    return "README.md" if page == README else page.relative_to(DOCS).as_posix()


def _run(page: Path, sources: list[dict], tmp_path: Path, xla_flags: str) -> dict:
    """Runs the instrumented blocks in a fresh interpreter; returns what they
    printed, or fails the test naming the block that raised."""
    spec, results, work = (tmp_path / f for f in ("spec.json", "results.json", "work"))
    spec.write_text(
        json.dumps({"page": str(page), "results": str(results), "blocks": sources})
    )
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-P", str(Path(__file__).resolve()), str(spec)],
        cwd=work,
        # The printed values are the CPU's (one process can hold a TPU), from
        # code compiled as users compile it.
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if not results.exists():
        tail = "\n".join(proc.stderr.splitlines()[-80:])
        pytest.fail(
            f"{_name(page)}: the interpreter exited with code {proc.returncode}:\n"
            + tail,
            pytrace=False,
        )
    outcome = json.loads(results.read_text())
    if outcome["failed"] is not None:
        line = outcome["failed"]
        stderr = proc.stderr.rpartition(BLOCK_START.format(line) + "\n")[2]
        pytest.fail(
            f"{_name(page)}: the block at line {line} raised:\n"
            + "\n".join(stderr.splitlines()[-80:]),
            pytrace=False,
        )
    return outcome


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(
            page,
            id=_name(page),
            marks=[pytest.mark.slow] if _name(page) in SLOW_PAGES else [],
        )
        for page in PAGES
    ],
)
def test_page(page: Path, tmp_path: Path, optimised_xla_flags: str) -> None:
    """The page's ```python blocks run and print what the page says."""
    name = _name(page)
    blocks = [b for b in parse_page(page.read_text()) if b.skip is None]
    if not blocks:
        pytest.skip(f"{name} has no ```python block to run")
    sources, expected = [], {}
    for block in blocks:
        code, prints = instrument(block)
        sources.append({"line": block.line, "code": code})
        expected.update(prints)
    outcome = _run(page, sources, tmp_path, optimised_xla_flags)

    errors = []
    for line, want in expected.items():
        printed = [text for at, text in outcome["prints"] if at == line]
        if not printed:
            errors.append(f"{name}:{line}: the checked print never ran")
        errors += [
            f"{name}:{line}: printed {text.strip()!r}, the comment expects {want!r}"
            for text in printed
            if not matches(text, want)
        ]
    for block in blocks:
        stdout = outcome["stdout"][str(block.line)]
        if block.output and not _output_matches(stdout, block.output.code):
            errors.append(
                f"{name}:{block.line}: the block printed\n"
                + textwrap.indent(stdout, "    ")
                + f"but the ```text block at line {block.output.line} shows\n"
                + textwrap.indent(block.output.code, "    ")
            )
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)


@pytest.mark.parametrize(
    ("actual", "expected", "ok"),
    [
        ("(8, 2)", "(8, 2)", True),
        ("(8, 3)", "(8, 2)", False),
        ("[0.875 0.875]", "[0.87  0.88]", True),
        ("0.5", "0.6", False),
        ("12800", "12900", False),
        ("['step_000012800']", "['step_000012900']", False),
        ("0.0", "0.0: the statistics stay on the other side", True),
        ("jax.jit: boom", "jax.jit: boom", True),
        ("Foo(a=1, b=[2, 3])", "Foo(a=1, ...)", True),
        ("LSTM: 4.93", "> 4.5: close to 5", True),
        ("[-2.1, -4.2]", "> -3.0", False),
        ("[-2.1, -2.9]", "between -3 and -2", True),
        ("done", "< 1.8", False),
    ],
)
def test_matches(actual: str, expected: str, ok: bool) -> None:
    assert matches(actual, expected) is ok


def test_a_comment_below_a_print_is_its_output() -> None:
    block = parse_page(
        "```python\n"
        "print('a', 1)  # a 1\n"
        "print('b')\n"
        "# b\n"
        "print({'c': (1, 2),\n"
        "       'd': 3})\n"
        "# {'c': (1, 2),\n"
        "#  'd': 3}: wrapped\n"
        "print('e')\n"
        "\n"
        "# not output: a blank line comes first\n"
        "x = 1\n"
        "# not output: below no print\n"
        "```\n"
    )[0]
    _, expected = instrument(block)
    assert expected == {2: "a 1", 3: "b", 6: "{'c': (1, 2), 'd': 3}: wrapped"}
    assert matches("{'c': (1, 2), 'd': 3}", expected[6])


def test_skip_marker_needs_a_reason() -> None:
    page = "<!-- docs-test: skip (needs a GPU) -->\n```python\nx = 1\n```\n"
    assert parse_page(page)[0].skip == "needs a GPU"
    with pytest.raises(ValueError, match="line 1"):
        parse_page(page.replace(" (needs a GPU)", ""))


def _run_blocks(spec_path: str) -> None:
    """In the page's interpreter: runs the blocks as one script, then writes
    what they printed, and which block raised, to the results file."""
    spec = json.loads(Path(spec_path).read_text())
    outcome = {"prints": [], "stdout": {}, "failed": None}

    def docs_print(line: int):
        def checked_print(*args, sep=" ", end="\n"):
            text = io.StringIO()
            print(*args, sep=sep, end=end, file=text)
            outcome["prints"].append((line, text.getvalue()))
            sys.stdout.write(text.getvalue())

        return checked_print

    script = types.ModuleType("__main__")
    script.__docs_print__ = docs_print
    sys.modules["__main__"] = script
    for block in spec["blocks"]:
        print(BLOCK_START.format(block["line"]), file=sys.stderr, flush=True)
        stdout = io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                exec(compile(block["code"], spec["page"], "exec"), script.__dict__)
        except Exception as error:  # shown without this function's frame
            traceback.print_exception(error.with_traceback(error.__traceback__.tb_next))
            outcome["failed"] = block["line"]
        finally:
            outcome["stdout"][block["line"]] = stdout.getvalue()
            sys.stdout.write(stdout.getvalue())
        if outcome["failed"] is not None:
            break
    Path(spec["results"]).write_text(json.dumps(outcome))


if __name__ == "__main__":
    _run_blocks(sys.argv[1])
