"""Every marked figure and table in the docs equals its committed result file.

The markers (``<!-- table: ... -->``, ``<!-- figure: ... -->``, ``<!-- unchecked: ... -->``)
and the checks live in ``scripts/docs_figures.py``; ``python scripts/docs_figures.py
--write`` rewrites the tables from their files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
figures = load_script("scripts/docs_figures.py", "docs_figures")


def test_every_marked_table_and_figure_equals_its_file():
    pytest.importorskip("tyro")  # the benchmark scripts' command lines (the train extra)
    problems = [
        str(problem)
        for page in figures.pages(ROOT)
        for problem in figures.check_text(page.read_text(), str(page.relative_to(ROOT)), ROOT)
    ]
    assert not problems, "\n".join(problems)


def test_the_pages_mark_their_figures():
    """The pages that report measurements carry markers (a page whose markers were dropped
    would pass the check above with nothing checked)."""
    counts = {
        page: len(re.findall(r"<!-- (?:table|figure|unchecked):", (ROOT / page).read_text()))
        for page in ("README.md", "docs/benchmarks.md", "docs/sb3.md", "docs/cleanrl.md")
    }
    assert all(counts.values()), counts


def test_every_measurement_in_the_docs_is_marked():
    """A number that looks like a measurement (a unit of time, rate or size, a ratio, a
    percentage; in a table row any decimal) is checked or marked unchecked with its source,
    or named as a setting in ``docs_figures.SETTINGS``."""
    problems = [
        str(problem)
        for page in figures.pages(ROOT)
        for problem in figures.unmarked(
            page.read_text(),
            str(page.relative_to(ROOT)),
            figures.SETTINGS.get(str(page.relative_to(ROOT)), ()),
        )
    ]
    assert not problems, "\n".join(problems)


def test_unmarked_finds_figures_and_spares_settings_code_and_marked_ones():
    def found(text: str, settings: tuple[str, ...] = ()) -> list[str]:
        return [
            p.what.removeprefix("unmarked figure ") for p in figures.unmarked(text, "p", settings)
        ]

    assert found("it ran at 1.28x Sync, 11.3 us per step, 61%.") == ["1.28x", "11.3 us", "61%"]
    assert found("a 9-11 ms step\nand 2,009 steps/s.") == ["9-11 ms", "2,009 steps/s"]
    assert found("| a | 12.5 | 1,234 | 7 |") == ["12.5", "1,234"]
    # layouts, image sizes, versions, counts, targets, code and links are no measurements
    assert found("2x4 and 1x1, 224x224, 36 x 36, Python 3.11, 8 envs, target >= 1.5x") == []
    assert found("`--timeout 120 s` and [a page](page.md#1.5x)") == []
    assert found("```bash\nrun 15 ms\n```") == []
    # an unchecked marker covers the figures of its paragraph before it, not after it
    assert found("at 1.2x and\n3 ms<!-- unchecked: a run at abc1234 -->; then 4 ms.") == ["4 ms"]
    # a figure marker covers only the number right before it
    marked = "1.1x and 1.28x<!-- figure: benchmarks/results/r.json a -->"
    assert found(marked) == ["1.1x"]
    # a line ending in an unchecked marker covers the table below it; a table block is
    # checked by the table check
    assert found("files:<!-- unchecked: x.json -->\n\n| a | 1.5 |\n| b | 2.5 |\n\nthen 3 ms") == [
        "3 ms"
    ]
    block = "<!-- table: benchmarks/fmt.py table benchmarks/results/r.json -->\n| 1.5 |\n<!-- /table -->"
    assert found(block) == []
    assert found("| a | 1.5 |\n\n| b | 2.5 |") == ["1.5", "2.5"]
    assert found("a spin of 50 us (a setting)", ("spin of 50 us",)) == []


@pytest.fixture
def results(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks" / "results"
    folder.mkdir(parents=True)
    (folder / "r.json").write_text(
        json.dumps({"rows": [{"name": "a b", "rate": 1234.56, "ratio": 0.9462}], "n": [3, 4]})
    )
    (tmp_path / "benchmarks" / "fmt.py").write_text(
        "def table(result):\n"
        "    return '\\n'.join(f\"| {r['name']} | {r['rate']:.0f} |\" for r in result['rows'])\n"
    )
    return tmp_path


def test_a_figure_that_differs_from_its_file_is_found(results: Path):
    check = figures.check_text
    ok = "rate 1,235 steps/s<!-- figure: benchmarks/results/r.json rows[name=a b].rate -->"
    assert check(ok, root=results) == []
    assert check("0.95x<!-- figure: benchmarks/results/r.json rows.0.ratio -->", root=results) == []
    assert (
        check("95%<!-- figure: benchmarks/results/r.json rows.0.ratio scale=100 -->", root=results)
        == []
    )
    assert check("n 4<!-- figure: benchmarks/results/r.json n.1 -->", root=results) == []
    assert check("0.75<!-- figure: benchmarks/results/r.json n.0 / n.1 -->", root=results) == []
    wrong = check("0.94x<!-- figure: benchmarks/results/r.json rows.0.ratio -->", root=results)
    assert len(wrong) == 1 and "shows 0.94" in str(wrong[0]), wrong
    missing = check("1.0<!-- figure: benchmarks/results/r.json rows.0.nothing -->", root=results)
    assert len(missing) == 1 and "nothing" in str(missing[0]), missing


def test_a_table_that_differs_from_its_file_is_found_and_rewritten(results: Path):
    marker = "<!-- table: benchmarks/fmt.py table benchmarks/results/r.json -->"
    good = f"text\n{marker}\n| a b | 1235 |\n<!-- /table -->\nmore\n"
    assert figures.check_text(good, root=results) == []
    stale = good.replace("1235", "1200")
    problems = figures.check_text(stale, "page.md", root=results)
    assert len(problems) == 1 and "-| a b | 1200 |" in str(problems[0]), problems
    assert figures.render_tables(stale, root=results) == good
    unclosed = figures.check_text(f"{marker}\n| a b | 1235 |\n", root=results)
    assert "no <!-- /table -->" in str(unclosed[0])


def test_malformed_markers_and_missing_sources_are_found(results: Path):
    check = figures.check_text
    assert check("1.0<!-- figure: benchmarks/results/r.json -->", root=results)
    assert check("<!-- table: benchmarks/fmt.py -->", root=results)
    assert check("<!-- unchecked: -->", root=results)
    assert check("2.1x <!-- unchecked: benchmarks/results/gone.json -->", root=results)
    assert check("2.1x <!-- unchecked: a run at 1f8eb86, not committed -->", root=results) == []


def test_result_files_hold_no_absolute_paths():
    absolute = re.compile(r"(?<![\w.~<>-])/(?:tmp|work|root|home|Users)/")
    found = [
        p.name
        for p in sorted((ROOT / "benchmarks" / "results").iterdir())
        if p.suffix in (".json", ".md") and absolute.search(p.read_text())
    ]
    assert not found, "result files with absolute paths: " + ", ".join(found)


def test_results_are_written_with_relative_paths_and_the_machine(tmp_path: Path):
    machine = load_script("benchmarks/_machine.py", "benchmarks_machine")
    repo = machine.REPO
    written = machine.relative_paths(
        {"output": repo / "benchmarks" / "results" / "x.json", "runs": [f"python {repo}/b.py"]}
    )
    assert written == {"output": "benchmarks/results/x.json", "runs": ["python b.py"]}
    # a checkout under any folder (a CI machine's /check/...), and a sibling that only
    # starts with the same name
    elsewhere = Path("/check/work/main")
    assert machine.relative_paths(
        {
            "output": "/check/work/main/r/x.json",
            "cd": "cd /check/work/main && ls /check/work/main2",
        },
        elsewhere,
    ) == {"output": "r/x.json", "cd": "cd . && ls /check/work/main2"}
    assert (
        machine.relative_paths("/tmp/base/pipelined_vec_env") == "<outside>/base/pipelined_vec_env"
    )
    record = machine.run_record(repo, 0.0, 0.5, ["numpy"])["machine"]
    assert {"cpu_model", "cpu_count", "kernel", "load_average", "load_average_1m_start"} <= set(
        record
    )
    machine.write_results(tmp_path / "r.json", {"package": str(repo / "pipelined_vec_env")}, "t")
    assert json.loads((tmp_path / "r.json").read_text()) == {"package": "pipelined_vec_env"}
