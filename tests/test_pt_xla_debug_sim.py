"""PT_XLA_DEBUG's compilation and execution analysis (``xlasim.runtime.debug_analysis``).

Facts measured on real torch_xla 2.9 with ``PJRT_DEVICE=CPU``, ``PT_XLA_DEBUG=1`` and
``PT_XLA_DEBUG_FILE`` (the same programs, the file compared line by line but for hashes, frame
locations and the three sizes real XLA reads off its executable): a graph compiled at a user's
``torch_xla.sync()`` gets a Compilation Analysis block, the compiled program's hash and a Post
Compilation Analysis, then an Execution Analysis with the same Graph Hash; running it again
(cached) gives an Execution Analysis only; ``PT_XLA_DEBUG_MAX_FRAME=1`` cuts the frames after
the first with a line of ten dots; ``ones * 3`` has one graph input, ``randn * 100`` two;
reading a value names "most likely user code ..." as the cause; ``torch_xla.compile`` names
its graphs ``<name>_clear_pending`` and ``<name>``; ``PT_XLA_DEBUG_LEVEL=1`` writes no
Execution Analysis (upstream's debug_tool/test_pt_xla_debug.py, CPU CI).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import xlasim

_RULE = "=" * 80
_DASHES = "-" * 80


def _compile_and_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log = tmp_path / "debug.txt"
    monkeypatch.setenv("PT_XLA_DEBUG", "1")
    monkeypatch.setenv("PT_XLA_DEBUG_MAX_FRAME", "1")
    monkeypatch.setenv("PT_XLA_DEBUG_FILE", str(log))
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        for _ in range(2):
            t = torch.ones(2, 2, device=torch_xla.device()) * 3
            torch_xla.sync()
        del t
    return log.read_text().split("\n")


def test_a_sync_compiles_and_runs_a_graph_then_runs_it_cached(tmp_path, monkeypatch):
    lines = _compile_and_run(tmp_path, monkeypatch)
    compile_hash = lines[5].removeprefix("Compilation Analysis:   Graph Hash: ")
    sync_frame = lines[9]
    assert sync_frame.startswith("Compilation Analysis:   sync (") and "torch_xla.py:" in sync_frame
    execution = [
        "",
        f"Execution Analysis: {_RULE}",
        "Execution Analysis: Execution Cause",
        "Execution Analysis:   user torch_xla.sync",
        "Execution Analysis: Graph Info: ",
        f"Execution Analysis:   Graph Hash: {compile_hash}",
        "Execution Analysis:   Number of Graph Inputs: 1",
        "Execution Analysis:   Number of Graph Outputs: 1",
        "Execution Analysis: Python Frame Triggered Execution: ",
        sync_frame.replace("Compilation Analysis", "Execution Analysis"),
        "Execution Analysis:   ..........",
        f"Execution Analysis: {_DASHES}",
        f"Execution Analysis: {_RULE}",
    ]
    compilation = [line.replace("Execution Analysis", "Compilation Analysis") for line in execution]
    compilation[2] = "Compilation Analysis: Compilation Cause"
    post = [f"Post Compilation Analysis: {_RULE}"]
    post += [
        f"Post Compilation Analysis: {name}: 0.000000 GB"
        for name in ("Graph input size", "Graph output size")
    ]
    post += [
        f"Post Compilation Analysis: {name}: Unknown  GB"  # as torch_xla writes an unread size
        for name in ("Aliased Input size", "Intermediate tensor size", "Compiled program size")
    ]
    post += [f"Post Compilation Analysis: {_DASHES}", f"Post Compilation Analysis: {_RULE}"]
    assert lines[:13] == compilation
    assert lines[13] == "" and lines[14].startswith("Computation hash: ") and lines[15] == ""
    assert lines[16:24] == post
    assert lines[24:37] == execution and lines[37:50] == execution  # the second run: cached
    assert lines[50:] == [""]


def test_causes_inputs_names_and_level_one(tmp_path, monkeypatch):
    log = tmp_path / "debug.txt"
    monkeypatch.setenv("PT_XLA_DEBUG_LEVEL", "1")
    monkeypatch.setenv("PT_XLA_DEBUG_FILE", str(log))
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        t = torch.randn(2, 2, device=torch_xla.device()) * 100
        t.cpu()

        def toy(x):
            return x * 2

        torch_xla.compile(toy)(torch.randn(3, device=torch_xla.device()))
    text = log.read_text()
    assert "Execution Analysis" not in text
    causes = [line for line in text.split("\n") if line.startswith("Compilation Analysis:   ")]
    assert causes[:3] == [
        "Compilation Analysis:   most likely user code trying to access tensor value before "
        "torch_xla.sync",
        "Compilation Analysis:   Graph Hash: " + causes[1].rsplit(" ", 1)[1],
        "Compilation Analysis:   Number of Graph Inputs: 2",
    ]
    assert "Compilation Analysis:   Graph Name: toy_clear_pending" in text
    assert "Compilation Analysis:   Graph Name: toy\n" in text
    assert text.count("torch_xla.compile clear the pending graph prior calling the target") == 1
    assert text.count("Compilation Analysis:   torch_xla.compile\n") == 1
