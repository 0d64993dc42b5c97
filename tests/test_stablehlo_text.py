"""``torch_xla.stablehlo``'s StableHLO text and bytecode, which jax lowers from the exported
graph (the ``tpu-compiler`` extra), and saving and loading a program; without the extra, asking
for them raises NotImplementedError naming it while exporting and running still work."""

from __future__ import annotations

import os

import pytest
import torch
from extras import need_tpu_compiler, tpu_compiler_missing

# MLIR's bytecode files start with these bytes (MLIR's bytecode format documentation; real
# torch_xla 2.9's get_stablehlo_bytecode() starts with them too, read on PJRT CPU).
_MLIR_BYTECODE_MAGIC = b"ML\xefR"


class _Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.w + 1.0


def _export(options=None):
    from torch_xla.stablehlo import exported_program_to_stablehlo

    x = torch.arange(6.0).reshape(2, 3)
    return exported_program_to_stablehlo(torch.export.export(_Affine(), (x,)), options), x


def test_text_and_bytecode_of_the_exported_graph(xlasim_sim):
    need_tpu_compiler()
    shlo, _ = _export()
    text = shlo.get_stablehlo_text()
    # The program's inputs in its signature's order (the parameter, then the argument) and its
    # result; the op names are the StableHLO specification's, which torch_xla's text for this
    # program also uses (read from real torch_xla 2.9 on PJRT CPU).
    assert "@main(%arg0: tensor<3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>" in text
    assert "stablehlo.multiply" in text
    assert "stablehlo.add" in text
    assert shlo.get_stablehlo_bytecode().startswith(_MLIR_BYTECODE_MAGIC)


def test_no_text_when_not_asked_for(xlasim_sim):
    from torch_xla.stablehlo import StableHLOExportOptions

    options = StableHLOExportOptions(include_human_readable_text=False)
    shlo, _ = _export(options)
    # torch_xla 2.9 keeps no text then (StableHLOFunc.text is None).
    assert shlo.get_stablehlo_text() is None


def test_saved_program_loads_and_runs(xlasim_sim, tmp_path):
    need_tpu_compiler()
    import torch_xla
    from torch_xla.stablehlo import StableHLOGraphModule

    shlo, x = _export()
    shlo.save(tmp_path)
    # torch_xla 2.9's layout: weights as numpy files, the function's metadata, bytecode and
    # text, and the constants directory (upstream torch_xla/stablehlo.py, _save_program_bundle).
    for name in ("data/w", "functions/forward.meta", "functions/forward.bytecode"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "functions/forward.mlir").read_text() == shlo.get_stablehlo_text()
    assert os.listdir(tmp_path / "constants") == []
    loaded = StableHLOGraphModule.load(tmp_path)
    assert loaded._bundle.state_dict["w"].tolist() == [2.0, 2.0, 2.0]
    out = loaded(x)
    assert out.device == torch_xla.device()
    assert out.cpu().tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]


def test_without_the_extra_text_names_it(xlasim_sim, tmp_path):
    if tpu_compiler_missing() is None:
        pytest.skip("the tpu-compiler extra is installed")
    shlo, x = _export()
    assert shlo(x).cpu().tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    with pytest.raises(NotImplementedError, match=r"needs the tpu-compiler extra"):
        shlo.get_stablehlo_text()
    with pytest.raises(NotImplementedError, match=r"needs the tpu-compiler extra"):
        shlo.get_stablehlo_bytecode()
    with pytest.raises(NotImplementedError, match=r"needs the tpu-compiler extra"):
        shlo.save(tmp_path)
