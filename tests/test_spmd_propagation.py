"""Graph-output shardings the simulator can derive, against real torch_xla 2.9 after sync.

Real values (PJRT CPU, 4 devices, t = randn(8, 6) sharded ('x', None) on a (2, 2) mesh, read
with ``_get_xla_sharding_spec`` after ``torch_xla.sync()``): a + b with nothing sharded
'{replicated}'; t.relu(), t * b, (t + 1).relu() t's sharding; t.sum() '{replicated}';
t @ w, t.t(), t.view(48), t[:4], t.sum(0) shardings chosen by GSPMD -> UNKNOWN here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xlasim

PARTIAL_X = "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"


def test_output_shardings_known_exactly():
    with xlasim.simulate("2x2"):
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        from xlasim.sharding.propagation import UNKNOWN, output_sharding

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        a, b = torch.randn(8, 6).to("xla"), torch.randn(8, 6).to("xla")
        t = torch.randn(8, 6).to("xla")
        xs.mark_sharding(t, mesh, ("x", None))
        w = torch.randn(6, 4).to("xla")
        known = {
            "{replicated}": [a + b, t.sum()],
            PARTIAL_X: [t.relu(), t * b, (t + 1).relu()],
        }
        for spec, results in known.items():
            for r in results:
                assert output_sharding(r).spec_string() == spec
        for r in (t @ w, t.t(), t.view(48), t[:4], t.sum(0)):
            assert output_sharding(r) is UNKNOWN


@pytest.mark.parametrize("text", ["{devices=[2,2]0,1,2,3}", PARTIAL_X, "{replicated}", "{manual}"])
def test_spec_strings_parse_back(text):
    from xlasim.sharding.propagation import parse_spec

    assert parse_spec(text).to_string() == text
    assert parse_spec("") is None
    with pytest.raises(ValueError, match="not a sharding spec string"):
        parse_spec("{maximal device=0}")
