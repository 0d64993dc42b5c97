"""CI configuration is checked like code: workflows against GitHub's schema, and what they run.

The schema is the copy vendored in check-jsonschema (no network). Workflows are read with
ruamel.yaml, a YAML 1.2 loader, so the key `on` stays a string as GitHub reads it (a YAML 1.1
loader such as PyYAML turns it into True).
"""

from __future__ import annotations

import configparser
import copy
import json
import re
import shlex
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


# What CI runs: every env of tox's default list.
CI_ENVS = {e.strip() for e in _tox()["tox"]["env_list"].split(",")}


def _load(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / (
        "github-workflows.json"
    )
    schema = json.loads(schema_file.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _errors(validator: jsonschema.protocols.Validator, doc: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def test_expected_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "tpu.yml"}, WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_github_schema(
    validator: jsonschema.protocols.Validator, path: Path
) -> None:
    assert _errors(validator, _load(path)) == []


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda wf: wf.pop("on"), id="no-trigger"),
        pytest.param(lambda wf: next(iter(wf["jobs"].values())).pop("runs-on"), id="no-runs-on"),
        pytest.param(lambda wf: next(iter(wf["jobs"].values())).update(steps="x"), id="bad-steps"),
    ],
)
def test_schema_rejects_broken_workflows(
    validator: jsonschema.protocols.Validator, breakage: Any
) -> None:
    # Guards the check above against a schema (or loader) that accepts anything.
    wf = copy.deepcopy(_load(ROOT / ".github" / "workflows" / "ci.yml"))
    breakage(wf)
    assert _errors(validator, wf) != []


def _run_scripts(job: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    return [(s["run"], dict(s.get("env") or {})) for s in job["steps"] if "run" in s]


def _tox_envs_in(script: str) -> set[str]:
    return {
        env
        for match in re.finditer(r"\btox\s+-e\s+(\S+)", script)
        for env in match.group(1).split(",")
    }


def test_ci_runs_every_tox_env_and_tox_defines_them() -> None:
    ci = _load(ROOT / ".github" / "workflows" / "ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"]), ci["on"]
    run_envs: set[str] = set()
    for job in ci["jobs"].values():
        assert job["runs-on"] == "ubuntu-latest"
        setup = [
            s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/setup-python")
        ]
        assert setup and str(setup[0]["with"]["python-version"]) == "3.11", job
        for script, _ in _run_scripts(job):
            run_envs |= _tox_envs_in(script)
    assert run_envs == CI_ENVS
    assert {f"testenv:{e}" for e in CI_ENVS} <= set(_tox().sections()), _tox().sections()


def _resolve(script: str, env: dict[str, str], inputs: dict[str, str]) -> list[str]:
    """The argv the step's pytest line gets, with workflow inputs and step env substituted."""

    def expr(match: re.Match[str]) -> str:
        return inputs[match.group(1)]

    resolved_env = {
        k: re.sub(r"\$\{\{\s*inputs\.(\w+)\s*\}\}", expr, str(v)) for k, v in env.items()
    }
    script = re.sub(r"\$\{\{\s*inputs\.(\w+)\s*\}\}", expr, script)
    script = script.replace("\\\n", " ")
    (line,) = [ln for ln in script.splitlines() if re.search(r"\bpytest\b", ln)]
    argv = shlex.split(line)
    return [
        re.sub(r"\$\{?(\w+)\}?", lambda m: resolved_env.get(m.group(1), m.group(0)), a)
        for a in argv
    ]


def test_tpu_workflow_is_manual_and_passes_marker_and_inputs_through() -> None:
    tpu = _load(ROOT / ".github" / "workflows" / "tpu.yml")
    assert set(tpu["on"]) == {"workflow_dispatch"}
    inputs = tpu["on"]["workflow_dispatch"]["inputs"]
    assert inputs["topology"]["default"] == "2x2x1"
    assert "accelerator" in inputs
    # The default pair must be a valid slice: 2x2x1 is a 3-D topology, so a 3-D generation.
    assert inputs["accelerator"]["default"] in {"v4", "v5p"}

    (job,) = tpu["jobs"].values()
    assert set(job["runs-on"]) == {"self-hosted", "tpu"}
    pytest_steps = [(s, e) for s, e in _run_scripts(job) if re.search(r"\bpytest\b", s)]
    assert len(pytest_steps) == 1, pytest_steps
    sentinel = {"topology": "9x8x7-topology-sentinel", "accelerator": "accel-sentinel"}
    argv = _resolve(*pytest_steps[0], inputs=sentinel)
    # Only pytest's own arguments count (`python -m pytest` puts a `-m` before them).
    argv = argv[argv.index("pytest") + 1 :]

    def value_after(flag: str) -> str:
        assert flag in argv, argv
        return argv[argv.index(flag) + 1]

    assert value_after("-m") == "tpu"
    assert value_after("--topology") == sentinel["topology"]
    assert value_after("--accelerator") == sentinel["accelerator"]
    assert "conformance" in argv


def test_tpu_workflow_installs_the_real_runtime() -> None:
    tpu = _load(ROOT / ".github" / "workflows" / "tpu.yml")
    (job,) = tpu["jobs"].values()
    install = " ".join(s for s, _ in _run_scripts(job) if "pip install" in s)
    assert "torch==2.9.0" in install
    assert re.search(r"\.\[[^\]]*\bxla\b[^\]]*\]", install), install
    assert re.search(r"\.\[[^\]]*\btest\b[^\]]*\]", install), install


def test_ci_script_is_valid_bash_and_runs_all_envs() -> None:
    script = ROOT / ".ci" / "run"
    text = script.read_text()
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    default = re.search(r"XLASIM_CI_ENVS:-([^}]*)\}", text)
    assert default, "no default env list in .ci/run"
    assert set(default.group(1).split()) == CI_ENVS
    limits = dict(re.findall(r"\[([\w-]+)\]=(\d+)", text))
    assert set(limits) == CI_ENVS
    # The per-env limits together stay within CI's 90 minutes.
    assert sum(map(int, limits.values())) <= 90 * 60, limits


def test_readme_names_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    claim = re.search(r"`tox -e ([\w,-]+)` runs everything CI runs", readme)
    assert claim, "the README no longer says which tox command runs everything CI runs"
    assert set(claim.group(1).split(",")) == CI_ENVS
