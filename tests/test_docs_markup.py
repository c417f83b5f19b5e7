"""The docs sources hold no reStructuredText markup that the site would show as text.

mkdocstrings renders docstrings as Markdown: a role such as ``:class:`X``` appears literally
on the API page, and a doctest under ``Example:`` turns into nested blockquotes. The checks
live in ``scripts/check_docs_html.py`` (which ``.ci/run`` also runs on the built site).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load_checker() -> ModuleType:
    return load_script("scripts/check_docs_html.py", "check_docs_html")


checker = _load_checker()


def _sources() -> list[Path]:
    files = [
        p for pkg in ("pipelined_vec_env", "reference_trainer") for p in (ROOT / pkg).rglob("*.py")
    ]
    return sorted(files) + sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def test_sources_hold_no_restructuredtext_markup():
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _sources()
        for line, what in checker.source_problems(path.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Returns a :class:`PipelinedVectorEnv`.", 2),
        ("like :class:`~gymnasium.vector.SyncVectorEnv` does", 2),
        ("see :py:meth:`reset`", 2),
        (":func:`make_vec` and :data:`STANDARD_SUITES`", 2),
        ('    """Split.\n\n    Example:\n        >>> split_range(0, 7, 3)\n    """', 4),
    ],
)
def test_source_check_finds_planted_markup(text, line):
    problems = checker.source_problems(f"first line\n{text}\n")
    assert problems and problems[0][0] == line, problems


def test_source_check_passes_markdown():
    text = (
        "A [`PipelinedVectorEnv`][pipelined_vec_env.PipelinedVectorEnv], like `SyncVectorEnv`;\n"
        "ratio: `x`, dict {'a': 1}, time 10:40.\n\n"
        "    Examples:\n        >>> split_range(0, 7, 3)\n        [(0, 3), (3, 5), (5, 7)]\n"
    )
    assert checker.source_problems(text) == []


@pytest.mark.parametrize(
    "html",
    [
        "<p>identical to :class:<code>gymnasium.vector.SyncVectorEnv</code></p>",
        "<blockquote>\n<blockquote>\n<blockquote>\n<p>split_range(0, 7, 3)\n[(0, 3)]</p>",
        "<p>see [<code>reset</code>][pipelined_vec_env.PipelinedVectorEnv.reset]</p>",
    ],
)
def test_html_check_finds_planted_markup(html):
    assert checker.html_problems(html), html


def test_html_check_passes_rendered_links_and_code():
    html = (
        '<p>A <a class="autorefs autorefs-internal" href="#pipelined_vec_env.PipelinedVectorEnv">'
        "<code>PipelinedVectorEnv</code></a>.</p>\n"
        '<div class="highlight"><pre><code><span class="gp">&gt;&gt;&gt; </span>x</code></pre></div>'
        "<blockquote><p>A quoted remark.</p></blockquote>"
    )
    assert checker.html_problems(html) == []


def test_main_fails_on_a_site_with_a_leftover_role(tmp_path, capsys):
    (tmp_path / "api").mkdir()
    (tmp_path / "index.html").write_text("<p>clean</p>\n")
    (tmp_path / "api" / "index.html").write_text("<p>ok</p>\n<p>:class:<code>X</code></p>\n")
    assert checker.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'api' / 'index.html'}:2:" in out and "1 problem(s) in 2 page(s)" in out
    (tmp_path / "api" / "index.html").write_text("<p>ok</p>\n")
    assert checker.main([str(tmp_path)]) == 0


def test_check_site_without_pages_names_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="site="):
        checker.check_site(tmp_path)


def test_the_site_builds_strict_and_renders_no_leftover_markup(tmp_path):
    """The docs site as CI builds it: `mkdocs build --strict` (unresolved cross-references
    abort it), then the HTML check, so a broken reference fails the README's test command
    and not only CI's docs step."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert checker.main([str(site)]) == 0
