"""Fail when the built docs site shows markup that mkdocstrings did not render.

The API reference is rendered from docstrings as Markdown, so reStructuredText leaks through
as text: a role such as ``:class:`X``` shows up literally, and a doctest under an
``Example:`` heading (an admonition in griffe's Google style) turns into nested blockquotes.

    python scripts/check_docs_html.py site     # after `mkdocs build --strict`

It scans every ``*.html`` under the site directory and exits 1 listing each problem with its
file and line. ``tests/test_docs_markup.py`` runs the same checks on the package sources and
``docs/*.md``, so a developer sees them in pytest before any build.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

_ROLE_NAMES = r"(?:py:)?(?:class|func|meth|data|attr|mod|exc|obj|const|ref|doc)"

# In Markdown/docstring sources: ":class:`X`", ":py:meth:`X`", ":func:`~a.b`".
SOURCE_ROLE = re.compile(rf":{_ROLE_NAMES}:`[^`\n]*`")
# A doctest in an `Example:` section (griffe renders that as an admonition, not code).
SOURCE_EXAMPLE = re.compile(r"^[ \t]*Example:[ \t]*\n(?:[ \t]*\n)*[ \t]*>>>", re.MULTILINE)

# In built HTML, a leftover role is its text before a backtick or an inline code element.
HTML_ROLE = re.compile(rf":{_ROLE_NAMES}:(?:`|<code)")
# Doctest lines rendered as text: Markdown reads ">>> x" as three nested blockquotes.
HTML_DOCTEST_QUOTE = re.compile(r"<blockquote>\s*<blockquote>\s*<blockquote>")
# A cross-reference autorefs left unresolved: "[<code>X</code>][pkg.X]" as text.
HTML_UNRESOLVED_REF = re.compile(r"\[<code>[^<]*</code>\]\[[A-Za-z_][\w.]*\]")


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _find(patterns: Iterable[tuple[re.Pattern[str], str]], text: str) -> list[tuple[int, str]]:
    problems = []
    for pattern, what in patterns:
        for match in pattern.finditer(text):
            snippet = match.group(0).strip().splitlines()[0][:80]
            problems.append((_line_of(text, match.start()), f"{what}: {snippet!r}"))
    return sorted(problems)


#: What each check finds, in built HTML pages and in the sources (docstrings, ``docs/*.md``).
HTML_CHECKS = (
    (HTML_ROLE, "reStructuredText role shown as text"),
    (HTML_DOCTEST_QUOTE, "doctest rendered as a blockquote (use an `Examples:` section)"),
    (HTML_UNRESOLVED_REF, "unresolved cross-reference"),
)
SOURCE_CHECKS = (
    (SOURCE_ROLE, "reStructuredText role (use `X` or [`X`][pkg.mod.X])"),
    (SOURCE_EXAMPLE, "doctest under `Example:` (renders as text; use `Examples:`)"),
)


def html_problems(html: str) -> list[tuple[int, str]]:
    """Unrendered markup in one built HTML page: ``(line, description)`` pairs, sorted by
    line; empty when the page is clean."""
    return _find(HTML_CHECKS, html)


def source_problems(text: str) -> list[tuple[int, str]]:
    """reStructuredText markup in a Python source file or a Markdown page: ``(line,
    description)`` pairs, sorted by line; empty when the text is clean."""
    return _find(SOURCE_CHECKS, text)


def check_site(site: Path) -> list[str]:
    """Every problem in the ``*.html`` files under ``site``, as ``path:line: description``.

    Raises:
        FileNotFoundError: ``site`` holds no HTML page (the docs were not built there).
    """
    pages = sorted(site.rglob("*.html"))
    if not pages:
        raise FileNotFoundError(f"site={str(site)!r}: no *.html pages; run `mkdocs build` first")
    return [
        f"{page}:{line}: {what}"
        for page in pages
        for line, what in html_problems(page.read_text(encoding="utf-8"))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, nargs="?", default=Path("site"), help="built site")
    args = parser.parse_args(argv)
    problems = check_site(args.site)
    for problem in problems:
        print(problem)
    pages = len(list(args.site.rglob("*.html")))
    print(f"check_docs_html: {len(problems)} problem(s) in {pages} page(s) under {args.site}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
