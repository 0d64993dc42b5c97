"""``torch_xla.stablehlo.exported_program_to_stablehlo``: a ``torch.export`` program run as a
callable on the XLA device.  Every expected value below was read from real torch_xla 2.9 on
PJRT CPU (the inputs' order in the program's signature is left out: torch_xla lists them in
its trace's order, the simulator in the graph's)."""

from __future__ import annotations

import pytest
import torch


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 2.0))
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x, k, unused):
        self.n.add_(1)
        return {"y": x * self.w + k, "half": (x * 0.5).to(torch.float16)}


def _args():
    return (torch.arange(6.0).reshape(2, 3), 3, torch.ones(4, dtype=torch.int32))


def test_exported_program_runs_on_the_device(xla_target):
    import torch_xla
    from torch_xla.stablehlo import StableHLOGraphModule, exported_program_to_stablehlo

    model = _Model()
    shlo = exported_program_to_stablehlo(torch.export.export(model, _args()))
    assert isinstance(shlo, StableHLOGraphModule)
    out = shlo(*_args())
    # The model's output tree comes back, its tensors on the XLA device.
    assert sorted(out) == ["half", "y"]
    assert {t.device for t in out.values()} == {torch_xla.device()}
    assert out["y"].dtype == torch.float32
    assert out["y"].cpu().tolist() == [[3.0, 5.0, 7.0], [9.0, 11.0, 13.0]]
    assert out["half"].dtype == torch.float16
    assert out["half"].cpu().tolist() == [[0.0, 0.5, 1.0], [1.5, 2.0, 2.5]]
    # The program's buffer update is not returned and not applied.
    assert model.n.item() == 0.0


def test_bundle_metadata(xla_target):
    from torch_xla.stablehlo import exported_program_to_stablehlo

    shlo = exported_program_to_stablehlo(torch.export.export(_Model(), _args()))
    bundle = shlo._bundle
    assert {k: v.tolist() for k, v in bundle.state_dict.items()} == {"w": [2.0] * 3, "n": 0.0}
    assert bundle.additional_constants == []
    meta = bundle.stablehlo_funcs[0].meta
    assert (meta.name, meta.stablehlo_version) == ("forward", "0.0.0")
    # Only inputs the outputs depend on are the program's; the mutated buffer is not.
    assert sorted((loc.type_.value, loc.position, loc.name) for loc in meta.input_locations) == [
        ("input_arg", 0, ""),
        ("parameter", -1, "w"),
    ]
    assert sorted((s.shape, s.dtype, s.dynamic_dims) for s in meta.input_signature) == [
        ([2, 3], "float32", []),
        ([3], "float32", []),
    ]
    # The int argument (baked in by export) and the tensor no output reads.
    assert [(loc.position, s.shape, s.dtype) for loc, s in meta.unused_inputs] == [
        (1, [], "int"),
        (2, [4], "int32"),
    ]
    assert [(s.shape, s.dtype) for s in meta.output_signature] == [
        ([2, 3], "float32"),
        ([2, 3], "float16"),
    ]


def test_single_tensor_output_and_aten_op(xla_target):
    """The shape of pytorch/xla's test_core_aten_ops check: an ATen op exported and run."""
    import torch_xla
    from torch_xla.stablehlo import exported_program_to_stablehlo

    class Op(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.aten.addmm(a, b, b.T)

    a, b = torch.ones(2, 2), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = exported_program_to_stablehlo(torch.export.export(Op(), (a, b)))(a, b)
    assert isinstance(out, torch.Tensor)
    assert out.device == torch_xla.device()
    assert out.cpu().tolist() == [[6.0, 12.0], [12.0, 26.0]]


def test_options_and_kwargs(xla_target):
    from torch_xla.stablehlo import StableHLOExportOptions, exported_program_to_stablehlo

    options = StableHLOExportOptions()
    assert (
        options.include_human_readable_text,
        options.override_tracing_arguments,
        options.override_tracing_kwargs,
        options.save_weights,
        options.inline_all_constant,
        options.export_weights,
        options.custom_ops_allowed_in_graph,
        options.export_node_metadata,
    ) == (True, None, None, True, True, True, set(), False)
    options.export_weights = False
    shlo = exported_program_to_stablehlo(torch.export.export(_Model(), _args()), options)
    assert shlo._bundle.state_dict == {}

    class Keyword(torch.nn.Module):
        def forward(self, x, *, y):
            return x + y

    exported = torch.export.export(Keyword(), (torch.ones(2),), {"y": torch.ones(2)})
    with pytest.raises(AssertionError, match=r"^Export to stablehlo doesnt support kwargs yet\.$"):
        exported_program_to_stablehlo(exported)
