"""``flash_attention`` on the simulator: the attention a TPU's Pallas kernel computes, with
its gradient, checked against attention written out here in eager CPU torch; its input
checks; the per-shard computation and output sharding under ``partition_spec``; and the
kernels that raise ``NotImplementedError``.

Real torch_xla cannot run the kernel on PJRT CPU (it imports JAX first and fails with
``ModuleNotFoundError: No module named 'jax'``), so the values are checked against the
kernel's arithmetic (JAX's ``flash_attention`` Pallas kernel): scores ``q kᵀ``, plus ``ab``,
times ``sm_scale``; a causal mask that lets query ``i`` see keys ``0..i``; segment ids that
let a query see only keys of its own segment.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.topology("2x2x1", accelerator="v4")


def _reference(q, k, v, causal=False, q_seg=None, kv_seg=None, sm_scale=1.0, ab=None):
    """Attention in float64 with explicit boolean masks (-inf where a key is hidden)."""
    scores = q.double() @ k.double().transpose(-1, -2)
    if ab is not None:
        scores = scores + ab.double()
    scores = scores * sm_scale
    q_len, kv_len = scores.shape[-2:]
    hidden = torch.zeros(q_len, kv_len, dtype=torch.bool)
    if causal:
        for i in range(q_len):
            hidden[i, i + 1 :] = True
    if q_seg is not None:
        hidden = hidden | (q_seg[:, None, :, None] != kv_seg[:, None, None, :])
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.double()


def _inputs(batch=2, heads=3, q_len=16, kv_len=128, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, heads, kv_len, dim, generator=gen)
    v = torch.randn(batch, heads, kv_len, dim, generator=gen)
    ab = torch.randn(batch, heads, q_len, kv_len, generator=gen)
    return q, k, v, ab


def _segments(batch, length, cuts):
    """Segment ids 0, 1, 2, ... with a new segment starting at each position in ``cuts``."""
    ids = torch.zeros(batch, length, dtype=torch.int32)
    for cut in cuts:
        ids[:, cut:] += 1
    return ids


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "scaled": dict(sm_scale=0.25),
    "bias": dict(bias=True, sm_scale=0.5),
    "causal_bias": dict(causal=True, bias=True),
    "segments": dict(segments=True),
    "everything": dict(causal=True, segments=True, bias=True, sm_scale=0.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.mat_mul_precision("highest")
def test_values_and_gradients_match_eager_attention(xlasim_sim, case):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    opts = CASES[case]
    # The kernel's backward takes whole 128-lane tiles of keys.
    kv_len = 128
    q, k, v, ab = _inputs()
    q_seg = kv_seg = None
    if opts.get("segments"):
        q_seg = _segments(2, q.shape[2], [5, 11])
        kv_seg = _segments(2, kv_len, [5, 11])
    bias = ab if opts.get("bias") else None
    causal, sm_scale = opts.get("causal", False), opts.get("sm_scale", 1.0)

    dev = torch_xla.device()
    leaves = [t.clone().to(dev).requires_grad_() for t in (q, k, v, ab)]
    out = flash_attention(
        *leaves[:3],
        causal,
        None if q_seg is None else q_seg.to(dev),
        None if kv_seg is None else kv_seg.to(dev),
        sm_scale,
        ab=leaves[3] if bias is not None else None,
    )
    assert out.device.type == "xla" and out.dtype == torch.float32
    cpu = [t.clone().requires_grad_() for t in (q, k, v, ab)]
    expected = _reference(
        *cpu[:3], causal, q_seg, kv_seg, sm_scale, cpu[3] if bias is not None else None
    )
    torch.testing.assert_close(out.cpu().double(), expected.detach(), rtol=1e-5, atol=1e-5)

    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    (out * weights.to(dev)).sum().backward()
    (expected * weights.double()).sum().backward()
    names = ["q", "k", "v", "ab"] if bias is not None else ["q", "k", "v"]
    for name, got, want in zip(names, leaves, cpu, strict=False):
        assert got.grad is not None, name
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5, msg=name)
    if bias is None:
        assert leaves[3].grad is None


def test_bfloat16_inputs_give_bfloat16_attention(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v, _ab = _inputs()
    dev = torch_xla.device()
    out = flash_attention(*(t.to(torch.bfloat16).to(dev) for t in (q, k, v)), causal=True)
    assert out.dtype == torch.bfloat16
    expected = _reference(*(t.to(torch.bfloat16) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.mat_mul_precision("highest")
def test_causal_mask_starts_at_the_first_key_when_lengths_differ(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    # Query 0 sees key 0 only, even with more keys than queries: its output is v[..., 0, :].
    q, k, v, _ab = _inputs(q_len=4, kv_len=9)
    dev = torch_xla.device()
    out = flash_attention(q.to(dev), k.to(dev), v.to(dev), causal=True).cpu()
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])
    expected = _reference(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_input_checks(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    dev = torch_xla.device()
    q, k, v, ab = (t.to(dev) for t in _inputs())
    seg = torch.zeros(2, 16, dtype=torch.int32).to(dev)
    # torch_xla's own check: segment ids come in pairs.
    with pytest.raises(AssertionError, match="Both q_segment_ids and kv_segment_ids"):
        flash_attention(q, k, v, q_segment_ids=seg)
    with pytest.raises(AssertionError, match="Both q_segment_ids and kv_segment_ids"):
        flash_attention(q, k, v, kv_segment_ids=seg)
    with pytest.raises(ValueError, match=r"same head_dim .* got 8, 8 and 4"):
        flash_attention(q, k, v[..., :4])
    with pytest.raises(ValueError, match="same kv_seq_len; got 128 and 6"):
        flash_attention(q, k, v[:, :, :6])
    with pytest.raises(ValueError, match="agree in batch and head dimensions"):
        flash_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError, match=r"ab must have shape \(2, 3, 16, 128\)"):
        flash_attention(q, k, v, ab=ab[..., :5])
    with pytest.raises(ValueError, match=r"kv_segment_ids must have shape \(2, 128\)"):
        flash_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg[:, :3])


def test_shapes_the_kernel_does_not_give_plain_attention_for(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    dev = torch_xla.device()
    q, k, v, _ab = (t.to(dev) for t in _inputs(batch=1, heads=1, q_len=8, kv_len=640))
    with pytest.raises(NotImplementedError, match="kv_seq_len 640"):
        flash_attention(q, k, v)
    q, k, v, _ab = (t.to(dev) for t in _inputs(batch=1, heads=1, q_len=8, kv_len=100))
    seg_q = torch.zeros(1, 8, dtype=torch.int32).to(dev)
    seg_kv = torch.zeros(1, 100, dtype=torch.int32).to(dev)
    with pytest.raises(NotImplementedError, match="kv block size must be a multiple of 128"):
        flash_attention(q, k, v, q_segment_ids=seg_q, kv_segment_ids=seg_kv)


def test_head_dim_the_tiled_kernel_refuses(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v, _ab = (t.to(torch_xla.device()) for t in _inputs(1, 1, 8, 1024, dim=200))
    with pytest.raises(NotImplementedError, match="head_dim=200 should be a multiple of 128"):
        flash_attention(q, k, v)


@pytest.mark.parametrize(("q_len", "kv_len"), [(16, 12), (16, 384), (600, 128)])
@pytest.mark.mat_mul_precision("highest")
def test_backward_refuses_lengths_the_kernel_backward_cannot_tile(xlasim_sim, q_len, kv_len):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v, _ab = _inputs(1, 1, q_len, kv_len)
    dev = torch_xla.device()
    # The forward runs (as on a TPU); the gradient stops where the kernel's backward would.
    expected = _reference(q, k, v, causal=True)
    out = flash_attention(q.to(dev).requires_grad_(), k.to(dev), v.to(dev), causal=True)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match=f"q_seq_len {q_len} and kv_seq_len {kv_len}"):
        out.sum().backward()


def _mesh():
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    return xs.Mesh(np.arange(4), (4, 1), ("x", "y"))


@pytest.mark.parametrize(
    ("spec", "spec_string"),
    [
        (("x", None, None, None), "{devices=[4,1,1,1]0,1,2,3}"),
        ((None, "x", None, None), "{devices=[1,4,1,1]0,1,2,3}"),
    ],
)
@pytest.mark.mat_mul_precision("highest")
def test_partition_spec_over_batch_or_heads_is_plain_attention(xlasim_sim, spec, spec_string):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    mesh = _mesh()
    q, k, v, ab = _inputs(batch=4, heads=4)
    dev = torch_xla.device()
    leaves = [t.clone().to(dev).requires_grad_() for t in (q, k, v, ab)]
    out = flash_attention(
        *leaves[:3], True, None, None, 0.5, ab=leaves[3], partition_spec=spec, mesh=mesh
    )
    assert torch_xla._XLAC._get_xla_sharding_spec(out) == spec_string
    cpu = [t.clone().requires_grad_() for t in (q, k, v, ab)]
    expected = _reference(*cpu[:3], True, None, None, 0.5, cpu[3])
    torch.testing.assert_close(out.cpu().double(), expected.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for name, got, want in zip("qkva", leaves, cpu, strict=True):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5, msg=name)
        assert torch_xla._XLAC._get_xla_sharding_spec(got.grad) == spec_string, name


@pytest.mark.mat_mul_precision("highest")
def test_partition_spec_over_the_sequence_attends_within_each_shard(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    # The kernel runs on each device's shard: with the sequence split four ways, every
    # device's queries see only its own three keys (and the causal mask restarts).
    mesh = _mesh()
    q, k, v, _ab = _inputs(batch=1, heads=2, q_len=12, kv_len=12)
    dev = torch_xla.device()
    out = flash_attention(
        q.to(dev),
        k.to(dev),
        v.to(dev),
        causal=True,
        partition_spec=(None, None, "x", None),
        mesh=mesh,
    )
    chunks = [
        _reference(q[:, :, s : s + 3], k[:, :, s : s + 3], v[:, :, s : s + 3], causal=True)
        for s in range(0, 12, 3)
    ]
    torch.testing.assert_close(out.cpu().double(), torch.cat(chunks, dim=2), rtol=1e-5, atol=1e-5)


def test_partition_spec_uses_the_global_mesh_first(xlasim_sim):
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.custom_kernel import flash_attention

    mesh = _mesh()
    xs.set_global_mesh(xs.Mesh(np.arange(4), (4, 1), ("fsdp", "model")))
    q, k, v, _ab = (t.to(torch_xla.device()) for t in _inputs(batch=4))
    # The passed mesh has no 'fsdp' axis; the global one does, and torch_xla takes it.
    out = flash_attention(q, k, v, partition_spec=("fsdp", None, None, None), mesh=mesh)
    assert torch_xla._XLAC._get_xla_sharding_spec(out) == "{devices=[4,1,1,1]0,1,2,3}"


def test_flash_attention_inside_torch_xla_compile_is_one_graph_compiled_once(xlasim_sim):
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.custom_kernel import flash_attention

    mesh = _mesh()
    xs.set_global_mesh(mesh)
    q, k, v, _ab = (t.to(torch_xla.device()).requires_grad_() for t in _inputs(batch=4))

    def step(q, k, v):
        out = flash_attention(q, k, v, causal=True, partition_spec=("x", None, None, None))
        out.sum().backward()
        return out

    torch_xla.sync()
    met.clear_all()
    compiled = torch_xla.compile(step, full_graph=True)
    for _ in range(3):
        for t in (q, k, v):
            t.grad = None
        compiled(q, k, v)
        assert q.grad is not None
    # One graph per step, compiled once.
    assert met.metric_data("ExecuteReplicatedTime")[0] == 3
    assert met.metric_data("CompileTime")[0] == 1


PALLAS_ONLY = [
    "quantized_matmul_int8",
    "gmm",
    "tgmm",
    "gmm_backward",
]


@pytest.mark.parametrize("name", PALLAS_ONLY)
def test_pallas_only_kernels_raise_naming_themselves(xlasim_sim, name):
    import torch_xla.experimental.custom_kernel as ck

    with pytest.raises(NotImplementedError, match=rf"custom_kernel\.{name}\)"):
        getattr(ck, name)(torch.zeros(2))


def test_backward_under_a_partition_spec_checks_the_shard_lengths(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.custom_kernel import flash_attention

    # Whole keys (128) per shard pass; split over the sequence, each shard has 32 keys.
    mesh = _mesh()
    dev = torch_xla.device()
    q, k, v, _ab = (t.to(dev).requires_grad_() for t in _inputs(batch=4, q_len=128))
    flash_attention(q, k, v, partition_spec=("x", None, None, None), mesh=mesh).sum().backward()
    assert q.grad is not None
    # Entering the manual region annotates the inputs in place, so take fresh ones.
    q, k, v, _ab = (t.to(dev).requires_grad_() for t in _inputs(batch=4, q_len=128))
    out = flash_attention(q, k, v, partition_spec=(None, None, "x", None), mesh=mesh)
    with pytest.raises(NotImplementedError, match="q_seq_len 32 and kv_seq_len 32"):
        out.sum().backward()
