"""``_XLAC._get_xla_tensors_hlo`` for graphs of device data: the parameters (with their
shardings under SPMD), the returned tuple, the instruction ids, and the empty text for
tensors torch_xla holds as plain data. Every expected text was read from real torch_xla 2.9
on PJRT CPU (4 devices)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _hlo(tensors):
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(tensors)


def _module(params: list[tuple[str, str, str]], outputs: list[int]) -> str:
    """The module text for parameters (shape, layout, sharding suffix) returned in order."""
    n = len(params)
    full = [shape + lay for shape, lay, _ in params]
    outs = ", ".join(full[i] for i in outputs)
    signature = ", ".join(f"p{i}.{i + 1}: {p[0]}" for i, p in enumerate(params))
    body = "".join(
        f"  %p{i}.{i + 1} = {full[i]} parameter({i}){p[2]}\n" for i, p in enumerate(params)
    )
    operands = ", ".join(f"{full[i]} %p{i}.{i + 1}" for i in outputs)
    return (
        f"HloModule IrToHlo.{n + 2}, entry_computation_layout={{({', '.join(full)})->({outs})}}"
        f"\n\nENTRY %IrToHlo.{n + 2} ({signature}) -> "
        f"({', '.join(params[i][0] for i in outputs)}) {{\n{body}"
        f"  ROOT %tuple.{n + 1} = ({outs}) tuple({operands})\n}}\n\n"
    )


def test_moved_data_until_the_step_barrier(xla_target):
    import torch_xla

    a = torch.randn(4, 2).to("xla")
    b = torch.ones(3, dtype=torch.int32).to("xla")
    c = torch.tensor(2.0).to("xla")
    assert _hlo([a, b, c]) == _module(
        [("f32[4,2]", "{1,0}", ""), ("s32[3]", "{0}", ""), ("f32[]", "", "")], [0, 1, 2]
    )
    torch_xla.sync()
    assert _hlo([a, b, c]) == ""  # plain device data now: no IR value to lower


def test_sharded_data_under_spmd(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    a = torch.randn(4, 2).to("xla")
    b = torch.ones(3, dtype=torch.int32).to("xla")
    c = torch.tensor(2.0).to("xla")
    assert _hlo([a]) == ""  # still on the host: the upload waits for a sharding or a use
    mesh = xs.Mesh(np.arange(4), (4, 1))
    xs.mark_sharding(a, mesh, (0, None))
    xs.mark_sharding(b, mesh, (0,))
    rows = ("f32[4,2]", "{1,0}", ", sharding={devices=[4,1]0,1,2,3}")
    ints = ("s32[3]", "{0}", ", sharding={devices=[4]0,1,2,3}")
    assert _hlo([a, c]) == _module([rows], [0])
    # One parameter per buffer, returned as often as it is asked for.
    assert _hlo([b, a, a]) == _module([ints, rows], [0, 1, 1])
    torch_xla.sync()
    assert _hlo([a]) == _module([rows], [0])  # sharded data keeps its IR value
    d = torch.randn(2, 2).to("xla")
    _ = d * 3  # a use uploads it, replicated
    assert _hlo([d]) == _module([("f32[2,2]", "{1,0}", ", sharding={replicated}")], [0])
