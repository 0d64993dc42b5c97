"""Function-local imports in the package defer something heavy or optional, and say why.

Upward imports and import cycles are the lint env's job (``lint-imports``, contracts in
pyproject.toml); a function-local import is how a cycle used to hide from it, so each one
left must carry a reason: a comment on the line above its block of imports, or at the end
of its own line (``# noqa: CODE`` alone is not a reason).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("xlasim", "tpu_backend")
_NOQA = re.compile(r"^noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?\s*-?\s*")


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _local_import_blocks(tree: ast.AST, lines: list[str]) -> list[list[ast.stmt]]:
    """Function-local import statements, grouped into runs with only blank lines between."""
    nodes: dict[int, ast.stmt] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    nodes[node.lineno] = node
    blocks: list[list[ast.stmt]] = []
    for node in sorted(nodes.values(), key=lambda n: n.lineno):
        last = blocks[-1][-1] if blocks else None
        between = range((last.end_lineno or last.lineno) + 1, node.lineno) if last else None
        if between is not None and all(not lines[i - 1].strip() for i in between):
            blocks[-1].append(node)
        else:
            blocks.append([node])
    return blocks


def _comment(line: str) -> str | None:
    if "#" not in line:
        return None
    return _NOQA.sub("", line.split("#", 1)[1].strip()).strip() or None


def unexplained_local_imports(path: Path) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    missing = []
    for block in _local_import_blocks(ast.parse(source), lines):
        above = lines[block[0].lineno - 2].strip() if block[0].lineno > 1 else ""
        if above.startswith("#") and _comment(above):
            continue
        for node in block:
            if _comment(lines[node.lineno - 1]) is None:
                where = path.relative_to(ROOT) if ROOT in path.parents else path
                missing.append(f"{where}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return missing


def test_every_function_local_import_says_why() -> None:
    missing = [m for path in _sources() for m in unexplained_local_imports(path)]
    assert not missing, "function-local imports without a reason comment:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("code", "explained"),
    [
        ("def f():\n    import ray\n", False),
        ("def f():\n    import ray  # noqa: F401\n", False),
        ("def f():\n    import ray  # deferred: Ray is optional\n", True),
        ("def f():\n    # Ray is optional.\n    import ray\n    import ray.train\n", True),
        ("import ray\n", True),
    ],
)
def test_the_check_itself(tmp_path: Path, code: str, explained: bool) -> None:
    path = tmp_path / "module.py"
    path.write_text(code)
    assert (unexplained_local_imports(path) == []) is explained
