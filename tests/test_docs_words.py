"""The docs speak of the project only, and stay short enough to read.

A user's reference names a measurement by commit and date; it never names a working
period, an issue number, a branch or a lock. The same holds for the names of the files
under ``benchmarks/results/``. A page over ``MAX_LINES`` lines is a diary, not a
reference (the generated API page is exempt).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 300
EXEMPT_FROM_LENGTH = {"api.md"}


BANNED = re.compile(
    r"\bsessions? \d"
    r"|\b(this|last|next|that|a) session\b"
    r"|\bissues? \d+"
    r"|\(issue \d+\)"
    r"|heavy-run lock"
    r"|\bbranch `"
    r"|\bhelpers?\b",
    re.IGNORECASE,
)
# The words above also mean things that are not working periods.
ALLOWED = re.compile(r"ray session|autogroup|setsid", re.IGNORECASE)
BANNED_FILE_NAME = re.compile(r"_run\d|session|_before_|branch|issue", re.IGNORECASE)


def banned_lines(text: str) -> list[tuple[int, str]]:
    """The (1-based line number, line) pairs of ``text`` that name a working period."""
    return [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if BANNED.search(ALLOWED.sub("", line))
    ]


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def test_banned_lines_finds_the_words_and_spares_the_look_alikes():
    text = "\n".join(
        [
            "measured in session 9",
            "see (issue 14)",
            "under the heavy-run lock",
            "on branch `wire`",
            "a Ray session starts",
            "setsid and autogroup",
            "measured at 0e86d0d on 2026-12-02",
        ]
    )
    assert [n for n, _ in banned_lines(text)] == [1, 2, 3, 4]


def test_pages_name_no_working_period_issue_or_branch():
    problems = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _pages()
        for n, line in banned_lines(path.read_text())
    ]
    assert not problems, "\n".join(problems)


def test_pages_are_short_enough_to_read():
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in _pages()
        if path.name not in EXEMPT_FROM_LENGTH
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"pages over {MAX_LINES} lines:\n" + "\n".join(long)


def test_result_file_names_name_no_run_or_working_period():
    bad = [
        p.name
        for p in sorted((ROOT / "benchmarks" / "results").iterdir())
        if BANNED_FILE_NAME.search(p.name)
    ]
    assert not bad, "result files named after runs or working periods: " + ", ".join(bad)


# Code (comments, docstrings, names, benchmark output) speaks of the project only too;
# "helper" and "a session" mean other things there.
BANNED_IN_CODE = re.compile(
    r"(?<![a-z])issues?[ _#-]?\d+"
    r"|\bsessions? \d"
    r"|\b(this|last|next) session\b"
    r"|heavy-run lock",
    re.IGNORECASE,
)


def test_code_names_no_working_period_or_issue_number():
    assert BANNED_IN_CODE.search("def test_ideal_rate_is_issue_14s_bound():")
    assert not BANNED_IN_CODE.search("one session's share of the CPU; tissue")
    problems = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in (
            "pipelined_vec_env",
            "reference_trainer",
            "benchmarks",
            "examples",
            "scripts",
            "tests",
        )
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BANNED_IN_CODE.search(ALLOWED.sub("", line))
    ]
    assert not problems, "\n".join(problems)
