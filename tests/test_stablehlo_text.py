"""``torch_xla.stablehlo``'s StableHLO text and bytecode, which jax lowers from the exported
graph (the ``tpu-compiler`` extra), and saving and loading a program; without the extra, asking
for them raises NotImplementedError naming it while exporting and running still work."""

from __future__ import annotations

import os
import re

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


def _main_signature(text: str) -> str:
    """The entry function's line, up to its first result type."""
    line = next(line for line in text.splitlines() if "@main(" in line)
    return line[line.index("@main(") : line.index(" {", line.index("->"))]


def test_dynamic_dimension_is_unknown_in_the_types(xlasim_sim):
    need_tpu_compiler()
    from torch.export import Dim
    from torch_xla.stablehlo import VariableSignature, exported_program_to_stablehlo
    from torch_xla.utils.stablehlo_test_utils import wrap_func_as_nn_module

    m = wrap_func_as_nn_module(torch.ops.aten.bmm.default)
    args = (torch.rand(8, 128, 256), torch.rand(8, 256, 3))
    ep = torch.export.export(m, args, dynamic_shapes=((None, {2: Dim("dim")}),))
    shlo = exported_program_to_stablehlo(ep)
    # Real torch_xla 2.9 on PJRT CPU: the inputs in its trace's order (bmm's second operand
    # first), the dynamic size as ?, no other input; the signatures keep the example's sizes
    # and list the dynamic dimension for the input only.
    assert _main_signature(shlo.get_stablehlo_text()) == (
        "@main(%arg0: tensor<8x256x?xf32>, %arg1: tensor<8x128x256xf32>) -> (tensor<8x128x?xf32>"
    )
    meta = shlo._bundle.stablehlo_funcs[0].meta
    assert meta.input_signature == [
        VariableSignature([8, 256, 3], "float32", [2]),
        VariableSignature([8, 128, 256], "float32", []),
    ]
    assert meta.output_signature == [VariableSignature([8, 128, 3], "float32", [])]
    assert [loc.position for loc in meta.input_locations] == [1, 0]
    out = shlo(*args)
    # The simulated TPU multiplies at its default (bf16-pass) precision.
    assert torch.allclose(out.cpu(), torch.bmm(*args), rtol=1e-2)


def test_inputs_in_the_order_torch_xla_traces_them(xlasim_sim):
    need_tpu_compiler()
    from torch_xla.stablehlo import exported_program_to_stablehlo
    from torch_xla.utils.stablehlo_test_utils import wrap_func_as_nn_module

    def signature(op, *args):
        ep = torch.export.export(wrap_func_as_nn_module(op), args)
        return _main_signature(exported_program_to_stablehlo(ep).get_stablehlo_text())

    # Real torch_xla 2.9 on PJRT CPU: sub(x, y) takes y first; addmm(bias, x, w) takes the
    # bias, then w, then x.
    assert signature(torch.ops.aten.sub.Tensor, torch.rand(2, 3), torch.rand(1, 3)) == (
        "@main(%arg0: tensor<1x3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>"
    )
    addmm = signature(
        torch.ops.aten.addmm.default, torch.rand(5), torch.rand(10, 5), torch.rand(5, 5)
    )
    assert addmm == (
        "@main(%arg0: tensor<5xf32>, %arg1: tensor<5x5xf32>, %arg2: tensor<10x5xf32>) -> "
        "(tensor<10x5xf32>"
    )


class _Scalars(torch.nn.Module):
    def forward(self, x):
        return (x - 5) * 2.5 - 1


def test_scalars_become_constants_unless_inlined(xlasim_sim):
    need_tpu_compiler()
    from torch_xla.stablehlo import (
        InputLocation,
        StableHLOExportOptions,
        exported_program_to_stablehlo,
    )

    x = torch.arange(4.0).reshape(2, 2)
    options = StableHLOExportOptions(inline_all_constant=False)
    shlo = exported_program_to_stablehlo(torch.export.export(_Scalars(), (x,)), options)
    # Real torch_xla 2.9 on PJRT CPU: 2.5 and 5 are f32 inputs (in its trace's order) kept as
    # the bundle's constants; 1 stays in the module.
    text = shlo.get_stablehlo_text()
    assert _main_signature(text) == (
        "@main(%arg0: tensor<f32>, %arg1: tensor<f32>, %arg2: tensor<2x2xf32>) -> (tensor<2x2xf32>"
    )
    assert "dense<5.000000e+00>" not in text
    assert [c.tolist() for c in shlo._bundle.additional_constants] == [2.5, 5.0]
    meta = shlo._bundle.stablehlo_funcs[0].meta
    assert meta.input_locations == [
        InputLocation.constant(0),
        InputLocation.constant(1),
        InputLocation.input_arg(0),
    ]
    assert shlo(x).cpu().tolist() == [[-13.5, -11.0], [-8.5, -6.0]]


def test_allowed_custom_ops_become_custom_calls(xlasim_sim):
    need_tpu_compiler()
    from torch_xla.stablehlo import StableHLOExportOptions, exported_program_to_stablehlo

    lib = torch.library.Library("xlasim_test_custom", "FRAGMENT")  # noqa: TOR901
    lib.define("pair(Tensor a, Tensor b) -> (Tensor, Tensor)")
    lib.impl("pair", lambda a, b: (torch.empty_like(a), b.new_empty(b.shape[1:])), "Meta")

    class Pair(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.xlasim_test_custom.pair(torch.sin(a), b)

    args = (torch.rand(3, 3), torch.rand(5, 5))
    options = StableHLOExportOptions(custom_ops_allowed_in_graph={"xlasim_test_custom"})
    shlo = exported_program_to_stablehlo(torch.export.export(Pair(), args), options)
    text = shlo.get_stablehlo_text()
    # Real torch_xla 2.9 on PJRT CPU writes the op as this custom call (plus an xla_shape
    # attribute), its two results as one tuple, unpacked by get_tuple_element.
    assert (
        "stablehlo.custom_call @xlasim_test_custom.pair.default(%0, %arg0) "
        '{api_version = 0 : i32, backend_config = ""} : (tensor<3x3xf32>, tensor<5x5xf32>) '
        "-> tuple<tensor<3x3xf32>, tensor<5xf32>>"
    ) in text
    assert text.count("stablehlo.get_tuple_element") == 2
    # The call has no kernel to run (real torch_xla fails there too, on the unknown target).
    with pytest.raises(NotImplementedError, match="custom call xlasim_test_custom.pair"):
        shlo(*args)


def test_placement_ops_keep_values_and_gradients(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.stablehlo_custom_call import place_to_device, place_to_host

    # As on real torch_xla 2.9 (upstream test_stablehlo_custom_call): the annotations leave
    # the value, and the gradient flows through them.
    a = torch.arange(4.0, device=torch_xla.device(), requires_grad=True)
    out = place_to_device(place_to_host(a))
    (out * 2).sum().backward()
    assert out.detach().cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert a.grad.cpu().tolist() == [2.0, 2.0, 2.0, 2.0]


class _Patterns(torch.nn.Module):
    def forward(self, x, y):
        from torch_xla.experimental.mark_pattern_utils import StableHLOCompositeBuilder

        first = StableHLOCompositeBuilder("test.sdpa", {"scale": 0.25, "n": 2, "l": [1.5, 2.0]})
        q, k, v = first.mark_inputs(*x.split(2, dim=-2))
        out = first.mark_outputs(torch.nn.functional.scaled_dot_product_attention(q, k, v))
        second = StableHLOCompositeBuilder("test.sdpa", {"scale": 2})
        a, b = second.mark_inputs(y, out)
        return out, second.mark_outputs(a * b + 1)


def test_marked_patterns_become_composites(xlasim_sim):
    need_tpu_compiler()
    from torch_xla.stablehlo import exported_program_to_stablehlo

    args = (torch.rand(1, 2, 6, 4), torch.rand(1, 2, 2, 4))
    shlo = exported_program_to_stablehlo(torch.export.export(_Patterns(), args))
    text = shlo.get_stablehlo_text()
    # Real torch_xla 2.9 on PJRT CPU writes these two lines for this program (floats as f32,
    # a list as a dense tensor, the bodies @test.sdpa.impl and @test.sdpa.impl_0).
    assert (
        '= stablehlo.composite "test.sdpa" %0, %1, %2 {composite_attributes = {l = dense<'
        "[1.500000e+00, 2.000000e+00]> : tensor<2xf32>, n = 2 : i64, scale = 2.500000e-01 : "
        "f32}, decomposition = @test.sdpa.impl} : (tensor<1x2x2x4xf32>, tensor<1x2x2x4xf32>, "
        "tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>"
    ) in text
    assert (
        '= stablehlo.composite "test.sdpa" %arg1, %3 {composite_attributes = {scale = 2 : i64},'
        " decomposition = @test.sdpa.impl_0}"
    ) in text
    assert "func.func private @test.sdpa.impl_0(" in text
    # The marks leave the values: the program computes the model.
    out, second = shlo(*args)
    expected, expected_second = _Patterns()(*args)
    assert torch.allclose(second.cpu(), expected_second, atol=1e-2)


def test_stablehlo_of_pending_tensors(xlasim_sim):
    need_tpu_compiler()
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.experimental.xla_marker  # noqa: F401 - defines xla::mark_tensor

    dev = torch_xla.device()
    a, b = torch.rand(10, 1).to(dev), torch.rand(1, 5).to(dev)
    text = xm.get_stablehlo([a * b])
    # Real torch_xla 2.9 on PJRT CPU: the inputs in its trace's order (the second operand
    # first), both broadcast to the product's shape.
    assert _main_signature(text) == (
        "@main(%arg0: tensor<1x5xf32>, %arg1: tensor<10x1xf32>) -> (tensor<10x5xf32>"
    )
    assert re.search(r"stablehlo.multiply.* : tensor<10x5xf32>", text)

    x = torch.rand(5).to(dev)
    y = torch.ops.xla.mark_tensor(x + 1, "test.p", 0, "0", True)
    y = torch.ops.xla.mark_tensor(y * y, "test.p", 0, "0", False, attr=(("k", 1.5),))
    text = xm.get_stablehlo([y])
    # As real torch_xla 2.9 writes the marked pattern (its body @test.p.impl).
    assert (
        'stablehlo.composite "test.p" %1 {composite_attributes = {k = 1.500000e+00 : f32}, '
        "decomposition = @test.p.impl} : (tensor<5xf32>) -> tensor<5xf32>"
    ) in text
    assert xm.get_stablehlo_bytecode([y]).startswith(_MLIR_BYTECODE_MAGIC)
