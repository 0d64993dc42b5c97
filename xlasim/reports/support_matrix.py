"""Which public names of torch_xla 2.9 the simulator provides, worked out from the code.

Two steps, because the reference runtime and the simulator live in different environments:

``python -m xlasim.reports.support_matrix record`` (with the real torch_xla 2.9 installed) imports
every public module of the real package and writes the names each one offers to
:data:`NAMES_FILE`, a checked-in list of facts (names only).

``python -m xlasim.reports.support_matrix write`` looks each recorded name up in the simulated
``torch_xla`` and writes ``docs/support-matrix.md``; ``check`` says whether the committed
page is still what the code gives (the tests run it).

A name is put in one of four classes by reading the simulator's code, not by a list kept
by hand:

* **simulated** -- the module has it and nothing in it raises ``NotImplementedError``;
* **partly** -- it exists but some argument or situation raises ``NotImplementedError``
  (``raise NotImplementedError`` in its body or in a method of the class, or a call to a
  simulator function that always raises it);
* **raises NotImplementedError** -- a function with no ``return`` whose body always ends
  in ``raise NotImplementedError``;
* **absent** -- the module or the attribute is missing (``ModuleNotFoundError`` /
  ``AttributeError`` naming it).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from xlasim.runtime.lowerings import KERNELS_FILE

__all__ = [
    "DOC_FILE",
    "NAMES_FILE",
    "Entry",
    "classify",
    "main",
    "read_names",
    "record_names",
    "render",
    "status_of",
]

NAMES_FILE = Path(__file__).with_name("torch_xla_2_9_public_names.txt")
"""Per public module of torch_xla 2.9: the names it offers, or why it does not import."""

DOC_FILE = Path(__file__).resolve().parents[2] / "docs" / "support-matrix.md"

_XLASIM_DIR = Path(__file__).resolve().parents[1]

SIMULATED = "simulated"
PARTLY = "partly"
NOT_IMPLEMENTED = "raises NotImplementedError"
ABSENT = "absent"
_STATUSES = (SIMULATED, PARTLY, NOT_IMPLEMENTED, ABSENT)

_UNIMPORTABLE = "# does not import on CPU: "


# -- recording (real torch_xla) -----------------------------------------------------------------
def _public_modules(package: types.ModuleType) -> Iterator[str]:
    yield package.__name__
    walk = pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".", onerror=str)
    for info in walk:
        if not any(part.startswith("_") for part in info.name.split(".")):
            yield info.name


def _top_level_assignments(module: types.ModuleType) -> set[str]:
    """Names a module binds with a plain top-level assignment (its own constants)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _public_names(module: types.ModuleType) -> list[str]:
    """``__all__`` when the module declares it; otherwise the public functions, classes and
    constants it defines itself (a package also counts what it re-exports from torch_xla)."""
    is_package = hasattr(module, "__path__")
    constants = _top_level_assignments(module)
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType | TypeVar):
            continue
        origin = getattr(value, "__module__", None)
        if not isinstance(origin, str) or not (inspect.isclass(value) or callable(value)):
            if name in constants:
                names.add(name)
        elif origin == module.__name__ or (is_package and origin.startswith("torch_xla")):
            names.add(name)
    declared = getattr(module, "__all__", None)
    if declared is None:
        return sorted(names)
    # __all__ decides for a plain module; a package also offers what it re-exports.  An
    # entry of __all__ the module does not have (two names run together) is no name.
    exported = {name for name in declared if hasattr(module, name)}
    return sorted(exported | names if is_package else exported)


def record_names() -> str:
    """The text of :data:`NAMES_FILE`, read from the torch_xla installed here."""
    import torch_xla  # deferred: only `record` needs the real runtime

    version = getattr(torch_xla, "__version__", "?")
    lines = [
        f"# Public names of torch_xla {version}, one module per [section]; recorded by",
        "# `python -m xlasim.reports.support_matrix record` from the real package (facts, "
        "no code).",
    ]
    for name in _public_modules(torch_xla):
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is recorded, not fatal
            lines += ["", f"[{name}]", f"{_UNIMPORTABLE}{type(exc).__name__}"]
            continue
        lines += ["", f"[{name}]", *_public_names(module)]
    return "\n".join(lines) + "\n"


def record_kernels() -> str:
    """The text of ``lowerings.KERNELS_FILE``: the aten ops the torch_xla installed here
    registers an XLA kernel for (what it lowers; everything else reaching the XLA key runs on
    its CPU fallback)."""
    import torch_xla  # deferred: only `record` needs the real runtime

    registered = torch._C._dispatch_get_registrations_for_dispatch_key("XLA")
    version = getattr(torch_xla, "__version__", "?")
    lines = [
        f"# aten ops with an XLA kernel in torch_xla {version} (the dispatcher's registrations "
        "for the XLA",
        "# key), one per line; recorded by `python -m xlasim.reports.support_matrix record` "
        "(facts, no code).",
        *sorted(name for name in set(registered) if name.startswith("aten::")),
    ]
    return "\n".join(lines) + "\n"


def read_names(text: str) -> dict[str, list[str] | None]:
    """Module -> public names (``None`` for a module that does not import on CPU)."""
    modules: dict[str, list[str] | None] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            modules[current] = []
        elif current is not None and line.startswith(_UNIMPORTABLE):
            modules[current] = None
        elif current is not None and line and not line.startswith("#"):
            names = modules[current]
            if names is not None:
                names.append(line)
    return modules


# -- classifying (simulator) --------------------------------------------------------------------
def _raises_not_implemented(stmt: ast.AST, helpers: Callable[[str], bool]) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    if isinstance(exc, ast.Name):
        return exc.id == "NotImplementedError" or helpers(exc.id)
    return False


def _resolve(expr: ast.expr, namespace: dict[str, Any]) -> Any:
    """The object a call's target names (``f``, ``mod.f``, ``torch_xla._XLAC.f``), or None."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or expr.id not in namespace:
        return None
    value = namespace[expr.id]
    for attr in reversed(parts):
        value = getattr(value, attr, None)
    return value


def _simulator_function(value: Any) -> bool:
    try:
        path = inspect.getsourcefile(value) if inspect.isfunction(value) else None
    except TypeError:
        return False
    return path is not None and Path(path).resolve().is_relative_to(_XLASIM_DIR)


def _calls_refusing_function(node: ast.AST, namespace: dict[str, Any], seen: set[int]) -> bool:
    """Whether ``node`` calls a simulator function that always raises NotImplementedError
    (a surface function handing its work to an ``_XLAC`` binding that refuses it)."""
    for call in ast.walk(node):
        callee = _resolve(call.func, namespace) if isinstance(call, ast.Call) else None
        fresh = _simulator_function(callee) and id(callee) not in seen
        if fresh and _status(callee, seen) == NOT_IMPLEMENTED:
            return True
    return False


def _function_status(
    node: ast.AST, helpers: Callable[[str], bool], namespace: dict[str, Any], seen: set[int]
) -> str:
    nodes = list(ast.walk(node))
    if not any(_raises_not_implemented(n, helpers) for n in nodes):
        return PARTLY if _calls_refusing_function(node, namespace, seen) else SIMULATED
    body = getattr(node, "body", [])
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in nodes)
    if body and _raises_not_implemented(body[-1], helpers) and not returns:
        return NOT_IMPLEMENTED
    return PARTLY


def _builds_not_implemented(helper: Any) -> bool:
    """Whether ``helper`` is a function that returns a ``NotImplementedError(...)`` (in some
    branch) for its caller to raise."""
    if not inspect.isfunction(helper):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(helper)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(
        isinstance(n, ast.Return)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name)
        and n.value.func.id == "NotImplementedError"
        for n in ast.walk(tree)
    )


def _helper_check(namespace: dict[str, Any]) -> Callable[[str], bool]:
    """Whether ``name`` is a function of ``namespace`` that builds a NotImplementedError
    (``raise _multi_replica('all_reduce')``)."""
    return lambda name: _builds_not_implemented(namespace.get(name))


def status_of(value: Any) -> str:
    """The class of a function or class of the simulator (see the module docstring)."""
    return _status(value, set())


def _status(value: Any, seen: set[int]) -> str:
    target = inspect.unwrap(value) if callable(value) else value
    if not (inspect.isfunction(target) or inspect.isclass(target)):
        return SIMULATED
    seen.add(id(target))
    try:
        source = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return SIMULATED
    module = sys.modules.get(target.__module__)
    namespace = target.__globals__ if inspect.isfunction(target) else vars(module or sys)
    helpers = _helper_check(namespace)
    node = ast.parse(source).body[0]
    if inspect.isclass(target):
        methods = [
            n for n in ast.walk(node) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        status = {m.name: _function_status(m, helpers, namespace, seen) for m in methods}
        if status.get("__init__") == NOT_IMPLEMENTED:
            return NOT_IMPLEMENTED  # no instance can be made
        return SIMULATED if set(status.values()) <= {SIMULATED} else PARTLY
    return _function_status(node, helpers, namespace, seen)


@dataclass(frozen=True)
class Entry:
    module: str
    name: str | None
    """``None`` for the module itself."""
    status: str


def classify(modules: dict[str, list[str] | None]) -> list[Entry]:
    """Look every recorded module and name up in the simulated torch_xla.

    Must run inside a simulation (``xlasim.simulate``), where ``torch_xla`` is the simulator.
    """
    entries = []
    for module_name, names in modules.items():
        if names is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            entries.append(Entry(module_name, None, ABSENT))
            continue
        entries.append(Entry(module_name, None, SIMULATED))
        for name in names:
            try:
                value = getattr(module, name)
            except AttributeError:
                entries.append(Entry(module_name, name, ABSENT))
            except NotImplementedError:
                entries.append(Entry(module_name, name, NOT_IMPLEMENTED))
            else:
                entries.append(Entry(module_name, name, status_of(value)))
    return entries


# -- the page -----------------------------------------------------------------------------------
_HEADER = """\
# Support matrix: torch_xla 2.9 on the simulator

Generated by `python -m xlasim.reports.support_matrix write` from the simulator's code and the
public names of real torch_xla 2.9 (`xlasim/reports/torch_xla_2_9_public_names.txt`); the tests
fail when this page is out of date. Do not edit it by hand.

- **simulated**: present, and no argument raises `NotImplementedError`.
- **partly**: present, but some arguments or situations raise `NotImplementedError` naming
  what is not simulated (for example collectives across more than one replica).
- **raises NotImplementedError**: present so that code importing it loads, but calling it
  raises `NotImplementedError` naming the feature.
- **absent**: not provided; using it raises `AttributeError` (or `ModuleNotFoundError` for a
  module), naming it.
"""


def render(modules: dict[str, list[str] | None], entries: list[Entry]) -> str:
    """The Markdown page for :func:`classify`'s result."""
    by_module: dict[str, list[Entry]] = {}
    for entry in entries:
        by_module.setdefault(entry.module, []).append(entry)
    present = [m for m, es in by_module.items() if es[0].status != ABSENT]
    missing = [m for m, es in by_module.items() if es[0].status == ABSENT]
    unimportable = [m for m, names in modules.items() if names is None]

    totals = {s: 0 for s in _STATUSES}
    for m in present:
        for e in by_module[m][1:]:
            totals[e.status] += 1
    lines = [_HEADER, "## Summary", ""]
    lines.append("| module | " + " | ".join(_STATUSES) + " |")
    lines.append("|---|" + "---:|" * len(_STATUSES))
    for m in present:
        counts = {s: sum(e.status == s for e in by_module[m][1:]) for s in _STATUSES}
        lines.append(f"| `{m}` | " + " | ".join(str(counts[s]) for s in _STATUSES) + " |")
    lines.append(
        "| **all simulated modules** | " + " | ".join(str(totals[s]) for s in _STATUSES) + " |"
    )
    lines.append("")
    lines.append(
        f"{len(missing)} more public modules of torch_xla 2.9 are absent (listed at the end)."
    )
    for m in present:
        if len(by_module[m]) == 1:
            continue  # a package with no public names of its own
        lines += ["", f"## `{m}`", ""]
        for status in _STATUSES:
            names = [f"`{e.name}`" for e in by_module[m][1:] if e.status == status]
            if names:
                lines.append(f"- **{status}** ({len(names)}): {', '.join(names)}")
    lines += ["", "## Absent modules", ""]
    lines += [f"- `{m}` ({len(modules[m] or [])} public names)" for m in missing]
    if unimportable:
        lines += [
            "",
            "Not counted: modules of torch_xla 2.9 that do not import on a CPU-only machine "
            "even with the real runtime: " + ", ".join(f"`{m}`" for m in unimportable) + ".",
        ]
    return "\n".join(lines) + "\n"


def _render_from_code() -> str:
    import xlasim  # deferred: the simulation is only needed to classify, not to record

    modules = read_names(NAMES_FILE.read_text(encoding="utf-8"))
    with xlasim.simulate(topology="2x2"):
        entries = classify(modules)
    return render(modules, entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xlasim.reports.support_matrix", description=__doc__
    )
    parser.add_argument("action", choices=["record", "write", "check"])
    parser.add_argument(
        "--doc",
        type=Path,
        default=DOC_FILE,
        help="the page to write or check (default: docs/support-matrix.md of this checkout)",
    )
    args = parser.parse_args(argv)
    if args.action == "record":
        NAMES_FILE.write_text(record_names(), encoding="utf-8")
        KERNELS_FILE.write_text(record_kernels(), encoding="utf-8")
        print(f"wrote {NAMES_FILE} and {KERNELS_FILE}")
        return 0
    page = _render_from_code()
    if args.action == "write":
        args.doc.write_text(page, encoding="utf-8")
        print(f"wrote {args.doc}")
        return 0
    if args.doc.read_text(encoding="utf-8") != page:
        print(f"{args.doc} is out of date: run `python -m xlasim.reports.support_matrix write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
