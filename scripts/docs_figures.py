"""Check (or rewrite) the figures in the docs against the committed result files.

Three markers, all HTML comments (the site does not show them):

- ``<!-- table: benchmarks/SCRIPT.py FUNCTION benchmarks/results/FILE.json -->`` on the
  line above a table and ``<!-- /table -->`` on the line below it: the text between is
  ``FUNCTION(result)``, where ``result`` is the whole JSON file, exactly.
- ``<!-- figure: benchmarks/results/FILE.json KEY [scale=S] -->`` right after a number in
  prose or a table cell: the last number before the marker on its line equals the value
  at ``KEY`` (times ``S``) rounded to the digits shown. ``KEY`` is dotted: ``a.b.0.c``
  indexes dicts and lists; ``[field=value]`` picks the first list item whose ``field`` is
  ``value`` (``throughput[name=ours step 1x4].vs_sync``); ``KEY / KEY2`` is the ratio of
  two values of the file.
- ``<!-- unchecked: SOURCE -->`` after figures that no test reads: ``SOURCE`` names where
  they come from (a result file, a commit's run); any repository path it names (a glob
  such as ``benchmarks/results/throughput*.json`` too) must exist. At the end of the
  line right above a table (blank lines between allowed), it covers the whole table.

A number that looks like a measurement (``unmarked``: a number with a unit of time, rate,
size, a ratio ``1.28x`` or a percentage; in a table row also any decimal or ``1,234``)
outside code and table blocks is a problem too unless a marker covers it or ``SETTINGS``
below names it as a setting (a default, a constant, a workload's size). In a paragraph,
list item or table row an ``unchecked`` marker covers the figures since the previous
marker; a ``figure`` marker covers only the number right before it. Not caught: bare
integers (counts, steps/s in a table without ``1,234`` separators), numbers split from
their unit by a line break.

Usage: ``python scripts/docs_figures.py`` lists every difference (exit 1 if any);
``--write`` rewrites each table block from its file (figures in prose are fixed by hand).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "Problem",
    "check_text",
    "lookup",
    "main",
    "pages",
    "render_tables",
    "unmarked",
]

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"<!-- table: (?P<script>\S+) (?P<function>\w+) (?P<file>\S+) -->")
TABLE_END = "<!-- /table -->"
FIGURE = re.compile(r"<!-- figure: (?P<file>\S+) (?P<key>[^>]+?)(?: scale=(?P<scale>\S+))? -->")
UNCHECKED = re.compile(r"<!-- unchecked: (?P<source>[^>]*\S)\s*-->")
ANY_MARKER = re.compile(r"<!--\s*/?(table|figure|unchecked)\b[^>]*-->")
CODE = re.compile(r"`[^`]*`")
NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")
REPO_PATH = re.compile(r"\b(?:benchmarks|docs|examples|scripts)/[\w.*/-]*[\w*]")
UNIT = (
    r"(?:[munµ]s|s|sec|seconds?|minutes?|min|hours?|%|k|"
    r"(?:env |decision )?steps/s|sps|fps|calls/s|[KMG]i?B(?:/s)?)"
)
RANGE = r"\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?"
MEASURED = re.compile(rf"(?<![\w.]){RANGE}(?:[ \u00a0]?{UNIT}|x)(?![\w/])")  # 1.28x, not 2x4
CELL_FIGURE = re.compile(r"(?<![\w.])(?:\d+\.\d+|\d{1,3}(?:,\d{3})+)(?![\w.])")
LINK = re.compile(r"\]\([^)]*\)")
TARGET = re.compile(
    rf"(?:[<>]=?|\u2264|\u2265) ?{RANGE}(?:[ \u00a0]?{UNIT}|x)?"
)  # a target: ">= 1.5x"
KEY_PART = re.compile(r"\[(?P<field>[^\]=]+)=(?P<value>[^\]]*)\]|\.?(?P<name>[^.\[]+)")


# Numbers that look like measurements but are settings: a default, a constant, the size of a
# workload. Each phrase is taken out of its page's lines before ``unmarked`` looks at them.
SETTINGS: dict[str, tuple[str, ...]] = {
    "README.md": ("stops at 15 minutes", "Every 3 minutes"),
    "docs/frames_throughput.md": (
        "batches of 256 KiB",
        "of 256 KiB and more",
        "(target 1.5x,",
        "(target 2x, met)",
        "with 2 ms of CPU per env step",
    ),
    "docs/benchmarks.md": (
        "burning 15 ms",
        "median 5 ms, p99 about 10x",
        "sleeping 3 ms + 0.5 ms per observation",
    ),
    "docs/benchmarks_costs.md": (
        "under 1 ms (`HAND_OVER_SECONDS`)",
        "at 0.8x",
        "To reach 0.8x",
        "waking 0.3 ms before",
        "up to 300 us",
        "5 ms worker spin instead of 0.5 ms",
    ),
    "docs/benchmarks_rollout.md": (
        "burning 4 ms",
        "sleeping 2 ms per observation",
        "`B` = 2 ms, `Te` = 4 ms",
        "(8 ms a round)",
        "(16 ms of",
        "167, 333 and 500 env steps/s",
        "10 ms CPU per step",
        "15 ms of CPU per step",
        "about 2x at `Ti = Te`",
        "8 envs of 10 ms",
    ),
    "docs/conformance.md": ("(default 120 s)", "1 vs 1.5 became 1"),
    "docs/decoupled.md": ("median 10 ms", "10x the median", "4 ms + 0.25 ms per env"),
    "docs/fault_tolerance.md": ("a 60 s step", "a generous 30 s", "a 10 % warm-up"),
    "docs/profiling.md": ("at least 30%",),
    "docs/ray.md": ("| 1.0 |", "| 0.0 |", "2 ms `ray.wait` slices"),
    "docs/trainer.md": (
        "`--target-kl` 0.02",
        "std 0.05 on xyz, 0.02 on rotation",
        "a rotation noise of 0.0025",
        "std 0.2",
        "| 1.0, 1.0, 0 |",
        "takes 64 MiB",
        "for 1.5 minutes",
    ),
    "docs/trainer_figures.md": ("every 3 minutes", "7.5 minutes of"),
    "docs/stages.md": ("4 CPU-bound envs of 4 ms", "a policy of 0.5 ms per observation"),
    "docs/tune.md": (
        "(1.5 s at the rate",
        "within 10% of each",
        "0.75 ms x (1 + log2 cpus), cpus capped at 8: 1.5 ms on 2 cores",
        "1.5 ms slices",
        "`verify_close` (15%)",
        "within 20% of the top",
        "about 1.25x less per nice step",
        "15% of the top",
        "the 0.5 ms migration cost",
    ),
    "docs/wire_format.md": (
        "(50 us)",
        "(500 us)",
        "(300 us)",
        "time constant 2 s",
        "every 0.1 s at most",
        "one 50 us spin",
        "budget 500 us",
        "timeouts of 1 ms doubling to 0.1 s",
        "(1 ms,",
        "at most 50 us",
        "60 us slower per step",
    ),
    "docs/worker_layer.md": ("2 ms `ray.wait` slices",),
}


@dataclass(frozen=True)
class Problem:
    """One figure or table in a page that differs from its source (1-based ``line``)."""

    page: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.what}"


def pages(root: Path = ROOT) -> list[Path]:
    """The pages checked: ``README.md`` and ``docs/*.md``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def lookup(data: Any, key: str) -> Any:
    """The value at the dotted ``key`` of ``data`` (see the module docstring).

    Raises:
        KeyError: where a part of ``key`` is not in ``data``.
    """
    pos = 0
    while pos < len(key):
        match = KEY_PART.match(key, pos)
        if match is None or match.end() == pos:
            raise KeyError(f"cannot parse {key!r} at {key[pos:]!r}")
        pos = match.end()
        if match["field"] is not None:
            found = [
                item
                for item in data
                if isinstance(item, dict) and str(item.get(match["field"])) == match["value"]
            ]
            if not found:
                raise KeyError(f"no item with {match['field']}={match['value']!r} in {key!r}")
            data = found[0]
        elif isinstance(data, list):
            data = data[int(match["name"])]
        elif isinstance(data, dict) and match["name"] in data:
            data = data[match["name"]]
        else:
            raise KeyError(f"{match['name']!r} not found in {key!r}")
    return data


_modules: dict[Path, ModuleType] = {}


def _function(root: Path, script: str, name: str) -> Callable[[dict], str]:
    path = (root / script).resolve()
    if path not in _modules:
        module_name = "_docs_figures_" + re.sub(r"\W", "_", script)
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise FileNotFoundError(f"no script {script}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
        _modules[path] = module
    return getattr(_modules[path], name)


def _load_json(root: Path, file: str) -> dict:
    return json.loads((root / file).read_text())


def _tables(lines: list[str]) -> list[tuple[int, int, re.Match[str]]]:
    """(open line index, close line index, the open marker) of each table block."""
    blocks = []
    for i, line in enumerate(lines):
        match = TABLE.fullmatch(line.strip())
        if match:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == TABLE_END), -1)
            blocks.append((i, end, match))
    return blocks


def _rendered(root: Path, match: re.Match[str]) -> str:
    return _function(root, match["script"], match["function"])(
        _load_json(root, match["file"])
    ).strip("\n")


def _check_tables(root: Path, page: str, lines: list[str]) -> list[Problem]:
    problems = []
    for start, end, match in _tables(lines):
        if end < 0:
            problems.append(Problem(page, start + 1, f"no {TABLE_END} after the table marker"))
            continue
        try:
            want = _rendered(root, match)
        except (OSError, AttributeError, KeyError, ValueError) as error:
            problems.append(Problem(page, start + 1, f"cannot render: {error!r}"))
            continue
        have = "\n".join(lines[start + 1 : end]).strip("\n")
        if have != want:
            diff = "\n".join(
                difflib.unified_diff(
                    have.splitlines(), want.splitlines(), "the page", match["function"], lineterm=""
                )
            )
            problems.append(Problem(page, start + 1, f"table differs from its file:\n{diff}"))
    return problems


def _shown(number: str) -> tuple[float, int]:
    digits = number.replace(",", "")
    return float(digits), len(digits.split(".")[1]) if "." in digits else 0


def _check_figure(root: Path, page: str, n: int, before: str, match: re.Match[str]) -> list:
    numbers = NUMBER.findall(before)
    if not numbers:
        return [Problem(page, n, f"no number before {match[0]}")]
    try:
        data = _load_json(root, match["file"])
        keys = [lookup(data, key.strip()) for key in match["key"].split(" / ")]
        value = float(keys[0]) / (float(keys[1]) if len(keys) > 1 else 1.0)
        value *= float(match["scale"] or 1)
    except (OSError, KeyError, IndexError, ValueError, TypeError, ZeroDivisionError) as error:
        return [Problem(page, n, f"{match[0]}: {error!r}")]
    shown, digits = _shown(numbers[-1])
    if round(value, digits) != shown:
        return [Problem(page, n, f"shows {numbers[-1]}, {match['key'].strip()} is {value!r}")]
    return []


def check_text(text: str, page: str = "<text>", root: Path = ROOT) -> list[Problem]:
    """Every difference between ``text``'s marked figures and tables and their files, and
    every marker that does not parse or names a file that is not there."""
    lines = text.splitlines()
    problems = _check_tables(root, page, lines)
    for n, text_line in enumerate(lines, 1):
        # a marker shown as code (`<!-- figure: ... -->` in prose about the markers) is text
        line = CODE.sub(lambda code: " " * len(code[0]), text_line)
        for marker in ANY_MARKER.finditer(line):
            if not (
                TABLE.fullmatch(marker[0])
                or marker[0] == TABLE_END
                or FIGURE.fullmatch(marker[0])
                or UNCHECKED.fullmatch(marker[0])
            ):
                problems.append(Problem(page, n, f"malformed marker {marker[0]}"))
        for match in TABLE.finditer(line):
            for path in (match["script"], match["file"]):
                if not (root / path).is_file():
                    problems.append(Problem(page, n, f"{path} is not in the repository"))
        start = 0
        for match in FIGURE.finditer(line):
            before = ANY_MARKER.sub(" ", line[start : match.start()])
            problems += _check_figure(root, page, n, before, match)
            start = match.end()
        for match in UNCHECKED.finditer(line):
            for path in REPO_PATH.findall(match["source"]):
                if not any(root.glob(path)):
                    problems.append(Problem(page, n, f"{path} is not in the repository"))
    return problems


def _paragraphs(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(first line index, lines) of each paragraph, list item and table row outside code
    and table blocks; a table right below a line that ends in an ``unchecked`` marker
    is left out (that marker names the table's source)."""
    blocks = {i for start, end, _ in _tables(lines) for i in range(start, end % len(lines) + 1)}
    found: list[tuple[int, list[str]]] = []
    fenced = covered = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or i in blocks:
            covered = False
            continue
        if not stripped:
            continue
        if stripped.startswith("|"):
            if not covered:
                found.append((i, [line]))
            continue
        # a line that ends in an unchecked marker covers the table right below it
        covered = re.search(r"<!-- unchecked:[^>]*-->$", stripped) is not None
        starts_item = re.match(r"\s*(?:[-*]|\d+\.)\s", line) is not None
        if (
            found
            and not starts_item
            and i > 0
            and lines[i - 1].strip()
            and (found[-1][0] + len(found[-1][1]) == i and not lines[i - 1].strip().startswith("|"))
        ):
            found[-1][1].append(line)
        else:
            found.append((i, [line]))
    return found


def unmarked(text: str, page: str = "<text>", settings: tuple[str, ...] = ()) -> list[Problem]:
    """Every measurement-looking number of ``text`` that no marker covers (see the module
    docstring). In a paragraph, list item or table row, an ``unchecked`` marker covers the
    figures since the previous marker; a ``figure`` marker covers the number right before
    it. Each phrase of ``settings`` is taken out of its line first."""
    problems = []
    for first, lines in _paragraphs(text.splitlines()):
        kept = []
        for line in lines:
            for phrase in settings:
                line = line.replace(phrase, " " * len(phrase))
            line = TARGET.sub(lambda m: " " * len(m[0]), line)
            kept.append(
                LINK.sub(lambda m: " " * len(m[0]), CODE.sub(lambda m: " " * len(m[0]), line))
            )
        joined = "\n".join(kept)
        is_row = joined.lstrip().startswith("|")
        start = 0
        segments = []
        for marker in [*ANY_MARKER.finditer(joined), None]:
            end = len(joined) if marker is None else marker.start()
            segment = joined[start:end]
            if marker is not None and marker[0].startswith("<!-- unchecked"):
                segment = ""
            elif marker is not None and marker[0].startswith("<!-- figure"):
                numbers = list(NUMBER.finditer(segment))
                if numbers:
                    last = numbers[-1]
                    segment = segment[: last.start()] + " " * len(last[0]) + segment[last.end() :]
            segments.append((start, segment))
            start = end if marker is None else marker.end()
        for offset, segment in segments:
            hits = [(m.start(), m[0]) for m in MEASURED.finditer(segment)]
            if is_row:
                hits += [(m.start(), m[0]) for m in CELL_FIGURE.finditer(segment)]
            for at, figure in sorted(hits):
                line = first + joined.count("\n", 0, offset + at) + 1
                problems.append(Problem(page, line, f"unmarked figure {figure}"))
    return problems


def render_tables(text: str, root: Path = ROOT) -> str:
    """``text`` with each table block rewritten from its file."""
    lines = text.splitlines()
    for start, end, match in reversed(_tables(lines)):
        if end >= 0:
            lines[start + 1 : end] = _rendered(root, match).splitlines()
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    """Print each problem of the pages under ``root``; with ``--write``, rewrite the tables
    first. Returns 1 if any problem is left, else 0."""
    argv = sys.argv[1:] if argv is None else argv
    problems = []
    for path in pages(root):
        text = path.read_text()
        if "--write" in argv and (new := render_tables(text, root)) != text:
            path.write_text(new)
            text = new
        page = str(path.relative_to(root))
        problems += check_text(text, page, root)
        problems += unmarked(text, page, SETTINGS.get(page, ()))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
