"""The simulator's source is written independently of torch_xla's: no run of
:data:`source_overlap.RUN_LINES` equal lines outside the API facts listed in
:data:`source_overlap.FACTS` (see ``tests/source_overlap.py`` for what is compared and how).

The other side is the installed torch_xla 2.9 wheel, so this runs in the ``xla-cpu`` env
(``XLASIM_REQUIRE_REAL_TORCH_XLA=1`` there: a missing wheel fails it); elsewhere it is skipped.
"""

from __future__ import annotations

import os
import time

import pytest
from source_overlap import (
    FACTS,
    RUN_LINES,
    Fact,
    Run,
    fact_lines,
    installed_upstream,
    judge,
    our_sources,
    shared_runs,
)

REQUIRE_ENV = "XLASIM_REQUIRE_REAL_TORCH_XLA"


@pytest.fixture(scope="module")
def upstream() -> dict[str, str]:
    sources, why = installed_upstream()
    if sources is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but {why}", pytrace=False)
        pytest.skip(why)
    return sources


def test_no_run_of_upstream_lines_outside_api_facts(upstream: dict[str, str]) -> None:
    ours = our_sources()
    started = time.perf_counter()
    verdict = judge(shared_runs(ours, upstream), ours)
    elapsed = time.perf_counter() - started
    assert not verdict.copied, (
        f"{len(verdict.copied)} runs of {RUN_LINES}+ lines read as torch_xla's source does; "
        "write them from the behaviour, in our own structure (or, if the lines are an API "
        "fact, list it in source_overlap.FACTS saying why):\n"
        + "\n".join(run.describe() for run in verdict.copied)
    )
    assert not verdict.unused, "facts no run needs any more (remove them): " + ", ".join(
        f"{fact.path} {fact.node} ({fact.part})" for fact in verdict.unused
    )
    assert elapsed < 30, f"the comparison took {elapsed:.1f} s"


def test_every_fact_names_lines_of_our_source() -> None:
    ours = our_sources()
    for fact in FACTS:
        assert fact.path in ours, fact
        assert fact_lines(fact, ours[fact.path]), f"{fact.node} ({fact.part}) is not in {fact.path}"
        assert fact.why


def test_a_copied_run_is_found_across_files_and_reported_with_line_numbers() -> None:
    # Synthetic sources: the checker itself, independent of any torch_xla install.
    theirs = {
        "torch_xla/a.py": "\n".join(
            ['"""Doc."""', "import os", "", *(f"x{i} = {i}" for i in range(8))]
        )
    }
    ours = {
        "xlasim/b.py": "\n".join(
            [
                "# comment",
                "y = 0",
                "x0 = 0  ",
                "",
                "from os import path",
                "x1 = 1",
                "# another",
                *(f"x{i} = {i}" for i in range(2, 6)),
                "z = 1",
            ]
        )
    }
    runs = shared_runs(ours, theirs)
    assert runs == [
        Run(
            ours="xlasim/b.py",
            our_lines=(3, 6, 8, 9, 10, 11),
            theirs="torch_xla/a.py",
            their_first=4,
            their_last=9,
            text=tuple(f"x{i} = {i}" for i in range(6)),
        )
    ]
    assert shared_runs({"xlasim/b.py": "\n".join(f"x{i} = {i}" for i in range(5))}, theirs) == []


def test_a_run_counts_only_where_six_lines_in_a_row_lie_outside_every_fact() -> None:
    names = [f'    "n{i}",' for i in range(9)]
    theirs = {"torch_xla/m.py": "\n".join(["__all__ = [", *names, "]", "def f():", "    pass"])}
    ours = {"xlasim/m.py": theirs["torch_xla/m.py"]}
    fact = Fact("xlasim/m.py", "__all__", "statement", "public names")
    stale = Fact("xlasim/m.py", "f", "signature", "nothing copied there")
    verdict = judge(shared_runs(ours, theirs), ours, [fact, stale])
    # Only `pass` lies outside the two facts: not a run of six.
    assert (len(verdict.copied), len(verdict.allowed), verdict.unused) == (0, 1, [])
    verdict = judge(shared_runs(ours, theirs), ours, [stale])
    assert (len(verdict.copied), verdict.unused) == (1, [])
    ours = {"xlasim/m.py": "\n".join(["def f():", "    return 1"])}
    assert judge([], ours, [stale]).unused == [stale]
