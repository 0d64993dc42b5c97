"""pytest's reports of one file's run, read into per-test outcomes: its junit XML, or (when a run
was cut short before pytest wrote it) its ``-v`` lines; and, for each test that did not pass,
the line that says what went wrong."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# Both sides' pytest runs: plugins that are not part of upstream's setup are kept out (see
# upstream_pass_rate's docstring), and ``-v`` lines say each test's outcome as it finishes.
PYTEST_ARGS = (
    "-p",
    "no:xlasim",
    "-p",
    "no:cacheprovider",
    "-v",
    "-o",
    "console_output_style=classic",
)
PASSED = "passed"
_WORST = ("passed", "skipped", "xfailed", "xpassed", "failed", "error")
_VERBOSE_LINE = re.compile(r"^(\S+?\.py)::(\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_VERBOSE_OUTCOME = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "xfailed",
    "XPASS": "xpassed",
}


@dataclass
class FileRun:
    """One file's run on one side: per-test outcomes, first error lines, and what cut it short."""

    outcomes: dict[str, str] = field(default_factory=dict)
    first_lines: dict[str, str] = field(default_factory=dict)
    note: str = ""  # time bound tripped, crash, collection error: why tests may be missing


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _error_line(message: str | None, text: str | None) -> str:
    """The line that says what went wrong: pytest's ``E`` lines beat its summary message."""
    e_lines = [ln[1:].strip() for ln in (text or "").splitlines() if ln.startswith("E ")]
    e_lines = [ln for ln in e_lines if ln]
    message = _first_line(message)
    if message and message not in ("collection failure",) and not message.startswith("failed on"):
        return message
    return e_lines[-1] if e_lines else message


def merge(run: FileRun, test: str, outcome: str, line: str = "") -> None:
    old = run.outcomes.get(test)
    if old is None or _WORST.index(outcome) > _WORST.index(old):
        run.outcomes[test] = outcome
        if line:
            run.first_lines[test] = line


def case_id(classname: str, name: str) -> str:
    """``Class::test``: junit's dotted class path and pytest's node id agree on this part."""
    return f"{classname.rsplit('.', 1)[-1]}::{name}" if classname else name


def parse_junit(xml_text: str) -> FileRun:
    run = FileRun()
    for case in ET.fromstring(xml_text).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        kinds = {child.tag: child for child in case}
        if not classname and "error" in kinds:  # a collection error: the file has no tests
            err = kinds["error"]
            run.note = f"collection error: {_error_line(err.get('message'), err.text)}"
            continue
        tid = case_id(classname, name)
        for tag, outcome in (("failure", "failed"), ("error", "error")):
            if tag in kinds:
                merge(run, tid, outcome, _error_line(kinds[tag].get("message"), kinds[tag].text))
        if "skipped" in kinds:
            kind = "xfailed" if kinds["skipped"].get("type") == "pytest.xfail" else "skipped"
            merge(run, tid, kind, _first_line(kinds["skipped"].get("message")))
        if not ({"failure", "error", "skipped"} & kinds.keys()):
            merge(run, tid, PASSED)
    return run


def parse_verbose(output: str) -> FileRun:
    """Outcomes from ``pytest -v`` lines: what a run that never wrote its junit file finished."""
    run = FileRun()
    for line in output.splitlines():
        match = _VERBOSE_LINE.match(line)
        if match:
            merge(run, match.group(2), _VERBOSE_OUTCOME[match.group(3)])
    return run
