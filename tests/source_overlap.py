"""Runs of identical lines between this project's Python source and torch_xla's.

The simulator mirrors torch_xla's public surface, so names, signatures and documented
constants are equal by necessity; its implementation is written from torch_xla's behaviour,
never from its source.  This module finds where the two texts coincide anyway: after
normalizing both sides (each line stripped; blank lines, comment-only lines and import
statements dropped, the latter because isort orders them and a mirrored module needs the
modules its original needs), every run of :data:`RUN_LINES` or more consecutive equal lines,
once with docstrings and once without them (a dropped docstring lets two code runs join).
:data:`FACTS` lists the places where equality is the API itself; a run counts only where
:data:`RUN_LINES` of its lines lie outside them.

``tests/test_source_overlap.py`` runs it in CI against the installed torch_xla 2.9 wheel.
Without one, point it at any torch_xla 2.9 source tree::

    git -C XLA_CHECKOUT archive v2.9.0 torch_xla | tar -x -C /tmp/xla29
    python tests/source_overlap.py /tmp/xla29
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

RUN_LINES = 6
"""Shortest run reported: five equal lines still happen by chance (an argument list, an
``if``/``raise`` pair); six in a row outside an API fact have not, in this project."""

REPO_ROOT = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("xlasim", "tpu_backend", "conformance", "tests", "bench")
UPSTREAM_VERSION = "2.9"


@dataclass(frozen=True)
class Fact:
    """A stretch of our source that must read as torch_xla's does, and why.

    ``node`` is a dotted name (``Class.method``, a module-level name); ``part`` says which of
    its lines: ``signature`` (a function's ``def`` through its last parameter), ``statement``
    (the whole assignment or class), ``fields`` (a class's header and its field
    declarations, not its methods) or ``call:NAME`` (every call of ``NAME`` in the function).
    """

    path: str
    node: str
    part: str
    why: str


FACTS: tuple[Fact, ...] = (
    *(
        Fact(
            "xlasim/torch_xla/core/xla_builder.py",
            f"Op.{method}",
            "signature",
            "xla_builder's op methods take XLA's operation attributes as parameters, in "
            "torch_xla's order (callers pass them positionally)",
        )
        for method in (
            "scatter",
            "select_and_scatter",
            "select_and_scatter_with_general_padding",
            "conv_with_general_dimensions",
            "conv_general",
            "conv_general_dilated",
        )
    ),
    Fact(
        "xlasim/torch_xla/distributed/zero_redundancy_optimizer.py",
        "ZeroRedundancyOptimizer.__init__",
        "signature",
        "the constructor's parameters, their order and defaults are torch_xla's API (callers "
        "pass them by keyword or position; the simulated class refuses them all alike)",
    ),
    Fact(
        "xlasim/torch_xla/_internal/tpu.py",
        "TpuEnv",
        "fields",
        "a TypedDict's keys are its type: torch_xla names the tpu-env keys in this order",
    ),
    Fact(
        "xlasim/torch_xla/_internal/tpu.py",
        "MeshShape",
        "fields",
        "a NamedTuple's fields are its positional API (MeshShape(x, y, z), shape.x)",
    ),
    Fact(
        "xlasim/torch_xla/experimental/custom_kernel.py",
        "paged_attention",
        "signature",
        "paged_attention's parameters, their order (callers pass them positionally) and "
        "defaults are torch_xla's API",
    ),
    *(
        Fact(
            "xlasim/torch_xla/experimental/custom_kernel.py",
            name,
            "signature",
            "the kernels' parameters, their order (callers pass them positionally; the xla "
            "kernels take the op schema's arguments in order) and defaults are torch_xla's API",
        )
        for name in (
            "paged_attention_xla",
            "multi_queries_paged_attention",
            "multi_queries_paged_attention_xla",
            "ragged_paged_attention",
            "ragged_paged_attention_xla",
        )
    ),
    Fact(
        "xlasim/torch_xla/debug/profiler.py",
        "trace",
        "signature",
        "xp.trace's parameters, their order (callers pass them positionally) and defaults",
    ),
    Fact(
        "xlasim/torch_xla/distributed/fsdp/xla_fully_sharded_data_parallel.py",
        "XlaFullyShardedDataParallel.__init__",
        "signature",
        "FSDP's constructor: every keyword, its position and default is public API",
    ),
    Fact(
        "xlasim/torch_xla/distributed/fsdp/xla_fully_sharded_data_parallel.py",
        "XlaFullyShardedDataParallel.__init__",
        "call:_wrap_children",
        "the constructor keywords torch_xla hands on to auto-wrapped children, each passed "
        "through under its own name (which ones are inherited is behaviour users see)",
    ),
    Fact(
        "xlasim/torch_xla/distributed/spmd/__init__.py",
        "__all__",
        "statement",
        "the module's public names; torch_xla's list, duplicate entries included, is what "
        "`from torch_xla.distributed.spmd import *` and `__all__` readers see",
    ),
    Fact(
        "xlasim/torch_xla/experimental/distributed_checkpoint/__init__.py",
        "__all__",
        "statement",
        "the package's public names, in torch_xla's order",
    ),
    Fact(
        "xlasim/torch_xla/experimental/custom_kernel.py",
        "FlashAttention.DEFAULT_BLOCK_SIZES",
        "statement",
        "flash attention's default block sizes: a public constant whose keys and values "
        "callers read and override",
    ),
    Fact(
        "xlasim/sharding/op_sharding.py",
        "ShardingType",
        "fields",
        "xs.ShardingType's members and values (ShardingUtil::ShardingType in torch_xla's C++)",
    ),
)


@dataclass(frozen=True)
class Run:
    """Equal normalized lines: ours (their line numbers in our file) and theirs."""

    ours: str
    our_lines: tuple[int, ...]
    theirs: str
    their_first: int
    their_last: int
    text: tuple[str, ...]

    def describe(self) -> str:
        head = (
            f"{self.ours}:{self.our_lines[0]}-{self.our_lines[-1]} = "
            f"{self.theirs}:{self.their_first}-{self.their_last} ({len(self.text)} lines)"
        )
        shown = [f"    | {line}" for line in self.text[:8]]
        if len(self.text) > 8:
            shown.append(f"    | ... {len(self.text) - 8} more")
        return "\n".join([head, *shown])


Lines = list[tuple[int, str]]
"""Normalized lines of one file: (line number in the file, stripped text)."""


def _docstring_lines(tree: ast.AST) -> Iterator[int]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            yield from range(first.lineno, (first.end_lineno or first.lineno) + 1)


def _import_lines(tree: ast.AST) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield from range(node.lineno, (node.end_lineno or node.lineno) + 1)


def normalize(source: str) -> tuple[Lines, Lines]:
    """The file's lines as compared: (with docstrings, without docstrings)."""
    try:
        tree: ast.AST | None = ast.parse(source)
    except SyntaxError:
        tree = None  # compare it line by line all the same
    imports = set(_import_lines(tree)) if tree else set()
    docstrings = set(_docstring_lines(tree)) if tree else set()
    with_docs: Lines = []
    for number, raw in enumerate(source.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#") and number not in imports:
            with_docs.append((number, line))
    without_docs = [(n, line) for n, line in with_docs if n not in docstrings]
    return with_docs, without_docs


def _runs_in(ours: Mapping[str, Lines], theirs: Mapping[str, Lines], k: int) -> Iterator[Run]:
    index: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, lines in theirs.items():
        texts = [text for _, text in lines]
        for start in range(len(texts) - k + 1):
            index[tuple(texts[start : start + k])].append((name, start))
    for our_name, our in ours.items():
        texts = [text for _, text in our]
        # Equal k-grams on one diagonal (same upstream file, same offset) chain into one run.
        diagonals: dict[tuple[str, int], list[int]] = defaultdict(list)
        for start in range(len(texts) - k + 1):
            for their_name, their_start in index.get(tuple(texts[start : start + k]), ()):
                diagonals[their_name, start - their_start].append(start)
        for (their_name, offset), starts in diagonals.items():
            their = theirs[their_name]
            chain = [starts[0]]
            for start in [*starts[1:], None]:
                if start is not None and start == chain[-1] + 1:
                    chain.append(start)
                    continue
                first, last = chain[0], chain[-1] + k - 1
                yield Run(
                    ours=our_name,
                    our_lines=tuple(n for n, _ in our[first : last + 1]),
                    theirs=their_name,
                    their_first=their[first - offset][0],
                    their_last=their[last - offset][0],
                    text=tuple(texts[first : last + 1]),
                )
                if start is not None:
                    chain = [start]


def shared_runs(
    ours: Mapping[str, str], theirs: Mapping[str, str], k: int = RUN_LINES
) -> list[Run]:
    """Every run of ``k`` or more equal normalized lines between a file of ``ours`` and one
    of ``theirs`` (both: path -> source text), a run found in both normalizations once."""
    our_norm = {name: normalize(text) for name, text in ours.items()}
    their_norm = {name: normalize(text) for name, text in theirs.items()}
    found: list[Run] = []
    for which in (0, 1):
        found += _runs_in(
            {n: v[which] for n, v in our_norm.items()},
            {n: v[which] for n, v in their_norm.items()},
            k,
        )
    # The longer of two runs over the same lines stands for both.
    found.sort(key=lambda run: -len(run.our_lines))
    kept: list[Run] = []
    for run in found:
        lines = set(run.our_lines)
        if not any(
            other.ours == run.ours and other.theirs == run.theirs and lines <= set(other.our_lines)
            for other in kept
        ):
            kept.append(run)
    return sorted(kept, key=lambda run: (run.ours, run.our_lines))


# ---------------------------------------------------------------------------------------------
# Facts: which of our lines each one covers


def _named_nodes(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(dotted name, node) for every class, function and assigned name, nested ones too."""
    pending: list[tuple[str, ast.AST]] = [("", tree)]
    while pending:
        prefix, parent = pending.pop()
        for node in getattr(parent, "body", ()):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + node.name
                yield name, node
                pending.append((name + ".", node))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        yield prefix + target.id, node


def _span(node: ast.AST) -> range:
    first: int = getattr(node, "lineno")  # noqa: B009 - every node passed has a position
    return range(first, (getattr(node, "end_lineno", None) or first) + 1)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def fact_lines(fact: Fact, source: str) -> set[int]:
    """The lines of ``source`` that ``fact`` covers (empty when it names nothing there)."""
    covered: set[int] = set()
    for name, node in _named_nodes(ast.parse(source)):
        if name != fact.node:
            continue
        if fact.part == "statement":
            covered.update(_span(node))
        elif fact.part == "signature" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            covered.update(range(node.lineno, node.body[0].lineno))
        elif fact.part == "fields" and isinstance(node, ast.ClassDef):
            covered.update(range(node.lineno, node.body[0].lineno))
            for statement in node.body:
                if isinstance(statement, ast.Assign | ast.AnnAssign | ast.Expr):
                    covered.update(_span(statement))
        elif fact.part.startswith("call:") and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef
        ):
            callee = fact.part.removeprefix("call:")
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and _called_name(inner) == callee:
                    covered.update(_span(inner))
    return covered


@dataclass(frozen=True)
class Verdict:
    copied: list[Run]
    """Runs with ``RUN_LINES`` consecutive lines outside every fact."""
    allowed: list[Run]
    """Runs that are facts, apart from fewer than ``RUN_LINES`` lines in a row."""
    unused: list[Fact]
    """Facts that name nothing, or that no run touches (stale entries)."""


def judge(
    runs: Iterable[Run],
    ours: Mapping[str, str],
    facts: Iterable[Fact] = FACTS,
    k: int = RUN_LINES,
) -> Verdict:
    covers = {
        fact: fact_lines(fact, ours[fact.path]) if fact.path in ours else set() for fact in facts
    }
    touched: set[Fact] = set()
    copied: list[Run] = []
    allowed: list[Run] = []
    for run in runs:
        in_fact = set()
        for fact, lines in covers.items():
            if fact.path == run.ours and lines.intersection(run.our_lines):
                touched.add(fact)
                in_fact |= lines
        longest = streak = 0
        for number in run.our_lines:
            streak = 0 if number in in_fact else streak + 1
            longest = max(longest, streak)
        (copied if longest >= k else allowed).append(run)
    return Verdict(copied, allowed, [fact for fact in covers if fact not in touched])


# ---------------------------------------------------------------------------------------------
# The two sides


def our_sources(root: Path = REPO_ROOT) -> dict[str, str]:
    """Our Python files, by path relative to the repository root."""
    return {
        path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
        for package in OUR_PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def installed_upstream() -> tuple[dict[str, str] | None, str]:
    """The installed torch_xla wheel's Python files (path inside site-packages -> text), read
    through its distribution metadata so that no import hook (the simulator's) can answer;
    or None and why they cannot be read here."""
    try:
        dist = importlib.metadata.distribution("torch_xla")
    except importlib.metadata.PackageNotFoundError:
        return None, f"real torch_xla is not installed for {sys.executable}"
    if not dist.version.startswith(UPSTREAM_VERSION + "."):
        return None, (
            f"the simulator mirrors torch_xla {UPSTREAM_VERSION}, but torch_xla "
            f"{dist.version} is installed"
        )
    sources = {
        file.as_posix(): Path(str(dist.locate_file(file))).read_text(encoding="utf-8")
        for file in dist.files or ()
        if file.suffix == ".py"
    }
    if not sources:
        return None, f"torch_xla {dist.version}'s metadata lists no Python files"
    return sources, f"torch_xla {dist.version} at {dist.locate_file('')}"


def tree_sources(root: Path) -> dict[str, str]:
    """The Python files under ``root`` (a source tree holding ``torch_xla/``)."""
    return {
        path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(root.rglob("*.py"))
    }


def main(argv: list[str]) -> int:
    if argv:
        theirs, where = tree_sources(Path(argv[0])), argv[0]
    else:
        installed, where = installed_upstream()
        if installed is None:
            print(f"{where}; pass a torch_xla {UPSTREAM_VERSION} source tree", file=sys.stderr)
            return 2
        theirs = installed
    ours = our_sources()
    verdict = judge(shared_runs(ours, theirs), ours)
    for run in verdict.copied:
        print(run.describe())
    for fact in verdict.unused:
        print(f"unused fact: {fact.path} {fact.node} ({fact.part})")
    print(
        f"{len(ours)} of our files against {len(theirs)} of {where}: {len(verdict.copied)} "
        f"copied runs, {len(verdict.allowed)} API facts, {len(verdict.unused)} unused facts",
        file=sys.stderr,
    )
    return 1 if verdict.copied or verdict.unused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
