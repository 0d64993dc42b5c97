"""``XLA_SAVE_TENSORS_FILE`` / ``XLA_SAVE_TENSORS_FMT``: the graphs a program syncs, appended to
``<file>.<ordinal>`` (``xlasim.runtime.graph_dump``).

Facts measured on real torch_xla 2.9 with ``PJRT_DEVICE=CPU`` (``CPU_NUM_DEVICES=4`` under SPMD),
the same programs, the files compared line by line but for hashes and frame locations: one
block per sync, written again when the graph runs from the cache; the default format is the IR
text; the ``hlo`` format under SPMD ends each block with the outputs' shardings; reading a
pending value (``.cpu()``) writes a block too, its frames starting at the user's line
(upstream's spmd/test_spmd_graph_dump.py checks the block's last lines, CPU CI).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import xlasim

_HASH = re.compile(r"[0-9a-f]{1,32}")


def _blocks(path) -> list[str]:
    return [b for b in path.read_text().split("[ScheduleSyncTensorsGraph]\n") if b]


def _check_frame_and_hashes(block: str, roots: int) -> list[str]:
    lines = block.split("\n")
    assert lines[0] == "TensorsGraphInfo:"
    frames = lines[1 : lines.index("")]
    assert frames and all(re.fullmatch(r"  \S+ \(.+:\d+\)", f) for f in frames)
    assert frames[-1].startswith("  test_") or "test_graph_dump_sim.py" in "".join(frames)
    hashes = lines[len(frames) + 2]
    found = hashes.removeprefix("Root Hashes: (").removesuffix(")").split(", ")
    assert len(found) == roots and all(_HASH.fullmatch(h) for h in found)
    return lines[len(frames) + 3 :]


def test_each_sync_appends_the_ir_of_its_graph(tmp_path, monkeypatch):
    base = tmp_path / "graphs.txt"
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(base))
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        for _ in range(2):  # the second sync runs the cached graph: written again
            a = torch.ones(2, device=torch_xla.device())
            b = torch.ones(2, device=torch_xla.device())
            torch_xla.sync()
            c = a + b
            torch_xla.sync()
        assert torch.equal(c.cpu(), torch.full((2,), 2.0))
    blocks = _blocks(tmp_path / "graphs.txt.0")  # the default device's ordinal
    add = [b for b in blocks if "aten::add" in b]
    assert len(add) == 2 and add[0].split("Root")[1] == add[1].split("Root")[1]
    rest = _check_frame_and_hashes(add[0], roots=1)
    assert rest[:9] == [
        "",
        "## BEGIN_GRAPH",
        "IR {",
        "  %0 = f32[] prim::Constant(), xla_shape=f32[]",
        "  %1 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}",
        "  %2 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}",
        "  %3 = f32[2]{0} aten::add(%2, %1, %0), xla_shape=f32[2]{0}, ROOT=0",
        "}",
        "",
    ]
    assert rest[9].startswith("Graph Hash: ") and _HASH.fullmatch(rest[9][12:])
    assert rest[10:] == ["", "## END_GRAPH", "", ""]


def test_hlo_format_under_spmd_ends_with_the_output_shardings(tmp_path, monkeypatch):
    base = tmp_path / "graphs.txt"
    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(base))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "hlo")
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        x = torch.ones(8, 4).to(torch_xla.device())
        y = torch.ones(8, 4).to(torch_xla.device())
        xs.mark_sharding(x, xs.Mesh(np.arange(4), (1, 4)), (0, 1))
        z = x + y
        torch_xla.sync()
        z.cpu()  # plain device data now: no graph, no block
    (block,) = _blocks(tmp_path / "graphs.txt.0")
    rest = _check_frame_and_hashes(block, roots=1)
    assert rest[:3] == [
        "",
        "## BEGIN_GRAPH",
        "HloModule IrToHlo.8, entry_computation_layout="
        "{(f32[8,4]{1,0}, f32[8,4]{1,0})->(f32[8,4]{1,0})}",
    ]
    assert "  %p1.3 = f32[8,4]{1,0} parameter(1), sharding={devices=[1,4]0,1,2,3}" in rest
    end = rest.index("## END_GRAPH")
    assert rest[end - 5 : end - 2] == ["}", "", ""] and rest[end - 1] == ""
    assert rest[end - 2].startswith("Graph Hash: ")
    assert rest[end:] == [
        "## END_GRAPH",
        "",
        "",
        "#OUTPUT_SHARDING_BEGIN",
        "",
        "f32[8,4] {devices=[1,4]0,1,2,3}",
        "",
        "#OUTPUT_SHARDING_END",
        "",
        "",
    ]


def test_an_op_whose_text_is_not_simulated_is_named_in_the_dump(tmp_path, monkeypatch):
    base = tmp_path / "graphs.txt"
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(base))
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        t = torch.ones(3, device=torch_xla.device()).sum()
        assert t.item() == 3.0  # the program runs on; the dump says what it leaves out
    (block,) = _blocks(tmp_path / "graphs.txt.0")
    assert "xlasim does not simulate the IR text of aten.sum" in block


def test_an_unknown_format_fails_the_first_sync_and_dot_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(tmp_path / "g.txt"))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "xyz")
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        t = torch.ones(2, device=torch_xla.device()).add_(1)
        with pytest.raises(RuntimeError, match=r"^Invalid save graph format: xyz$"):
            torch_xla.sync()  # torch_xla 2.9's error, at the first graph it dumps
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "dot")  # real: a graphviz digraph
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        t = torch.ones(2, device=torch_xla.device()).add_(1)
        torch_xla.sync()
        del t
    (block,) = _blocks(tmp_path / "g.txt.0")
    assert "xlasim does not simulate the dot format of graph dumps" in block
