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
  such as ``benchmarks/results/throughput*.json`` too) must exist. On a line of its own
  right above a table, either figure-free marker covers the whole table.

A number that looks like a measurement (``unmarked``: a number with a unit of time, rate,
size, a ratio ``1.28x`` or a percentage; in a table row also any decimal or ``1,234``)
on a line with no marker, outside code and table blocks, is a problem too: it is marked,
or named in ``SETTINGS`` below as a setting (a default, a constant, a workload's size).

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
    r"(?:[munµ]s|s|sec|seconds?|minutes?|min|hours?|x|%|k|"
    r"(?:env |decision )?steps/s|sps|fps|calls/s|[KMG]i?B(?:/s)?)"
)
RANGE = r"\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?"
MEASURED = re.compile(rf"(?<![\w.]){RANGE}\s?{UNIT}(?![\w/])")
CELL_FIGURE = re.compile(r"(?<![\w.])(?:\d+\.\d+|\d{1,3}(?:,\d{3})+)(?![\w.])")
LINK = re.compile(r"\]\([^)]*\)")
KEY_PART = re.compile(r"\[(?P<field>[^\]=]+)=(?P<value>[^\]]*)\]|\.?(?P<name>[^.\[]+)")


# Numbers that look like measurements but are settings: a default, a constant, the size of a
# workload. Each phrase is taken out of its page's lines before ``unmarked`` looks at them.
SETTINGS: dict[str, tuple[str, ...]] = {}


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


def unmarked(text: str, page: str = "<text>", settings: tuple[str, ...] = ()) -> list[Problem]:
    """Every measurement-looking number of ``text`` that no marker covers (see the module
    docstring); each phrase of ``settings`` is taken out of its line first."""
    problems = []
    lines = text.splitlines()
    blocks = {i for start, end, _ in _tables(lines) for i in range(start, end % len(lines) + 1)}
    fenced = covered = False
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        if fenced or stripped.startswith("```") or n - 1 in blocks:
            continue
        if ANY_MARKER.search(CODE.sub(" ", line)):
            # a marker alone on its line covers the table right below it
            covered = ANY_MARKER.fullmatch(stripped) is not None
            continue
        covered = covered and stripped.startswith("|")
        if covered:
            continue
        for phrase in settings:
            line = line.replace(phrase, " ")
        line = LINK.sub("]", CODE.sub(" ", re.sub(r"<!--.*?-->", " ", line)))
        found = MEASURED.findall(line)
        if stripped.startswith("|"):
            found += CELL_FIGURE.findall(line)
        if found:
            problems.append(Problem(page, n, f"unmarked figure {', '.join(found)}"))
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
