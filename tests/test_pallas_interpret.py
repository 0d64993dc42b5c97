"""Pallas TPU kernels on the simulated TPU: ``make_kernel_from_pallas`` / ``trace_pallas`` and
``_xla_tpu_custom_call`` run the kernel's own JAX code in JAX's TPU interpret mode (the
``tpu-compiler`` extra brings JAX); without the extra, asking for JAX says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from extras import need_tpu_compiler, tpu_compiler_missing


def _add_kernel():
    import jax
    from jax.experimental import pallas as pl

    def add_vectors_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    @jax.jit
    def add_vectors(x, y):
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(add_vectors_kernel, out_shape=out)(x, y)

    return add_vectors


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16])
def test_a_kernel_runs_on_xla_tensors(xlasim_sim, dtype):
    need_tpu_compiler()
    import torch_xla
    from torch_xla.experimental.custom_kernel import jax_import_guard, make_kernel_from_pallas

    jax_import_guard()
    kernel = make_kernel_from_pallas(_add_kernel(), lambda x, y: [(x.shape, x.dtype)])
    x = (torch.arange(64) - 20).reshape(8, 8).to(dtype)
    y = torch.arange(64).reshape(8, 8).to(dtype) * 3
    out = kernel(x.to("xla"), y.to("xla"))
    assert out.device == torch_xla.device() and out.dtype == dtype
    assert torch.equal(out.cpu(), x + y)


def test_a_gridded_kernel_sees_its_blocks(xlasim_sim):
    # A grid of (8, 128) blocks: each program writes its block's grid index, so the result
    # shows the kernel's own tiling, which a plain reimplementation of the math would not.
    need_tpu_compiler()
    import torch_xla
    from torch_xla.experimental.custom_kernel import jax_import_guard, make_kernel_from_pallas

    jax_import_guard()
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 0 + (pl.program_id(0) * 10 + pl.program_id(1)).astype(jnp.float32)

    def tiled(x):
        block = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(2, 3),
            in_specs=[block],
            out_specs=block,
        )(x)

    run = make_kernel_from_pallas(tiled, lambda x: [(x.shape, x.dtype)])
    out = run(torch.zeros(16, 384).to(torch_xla.device())).cpu()
    expected = torch.tensor([[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]])
    assert torch.equal(out, expected.repeat_interleave(8, 0).repeat_interleave(128, 1))


def test_trace_pallas_caches_payloads_when_asked(xlasim_sim):
    need_tpu_compiler()
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch_xla.experimental.custom_kernel import trace_pallas

    x = torch.ones(8, 8).to(torch_xla.device())
    met.clear_all()
    payload, tensors = trace_pallas(_add_kernel(), x, x)
    assert tensors == [x, x] and "custom_call_config" in payload
    add = _add_kernel()
    first, _ = trace_pallas(add, x, x, use_cache=True)
    again, _ = trace_pallas(add, x, x, use_cache=True)
    # torch_xla 2.9 (experimental/custom_kernel.py): a cache hit returns the same payload and
    # counts trace_pallas_cache_hit.
    assert again == first
    assert met.counter_value("trace_pallas_cache_hit") == 1
    # Traced again without the cache, the same call names the same kernel (the simulator's
    # payloads are handles: a kernel called every step must not add one per step).
    assert trace_pallas(add, x, x)[0] == trace_pallas(add, x, x)[0]
    (out,) = torch_xla._XLAC._xla_tpu_custom_call([x, x], again, [x.shape], [x.dtype])
    assert out.cpu().tolist() == [[2.0] * 8] * 8


def test_paged_attention_runs_jaxs_kernel(xlasim_sim):
    # Decode attention over paged keys and values (8 query heads over one key/value head):
    # what JAX's own kernel returns when JAX calls it, and close to attention written out here
    # over each sequence's first `length` keys (the kernel's dots round as JAX's TPU interpret
    # mode rounds them).
    need_tpu_compiler()
    import torch_xla
    from torch_xla.experimental.custom_kernel import jax_import_guard, paged_attention

    jax_import_guard()
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel

    g = torch.Generator().manual_seed(0)
    batch, heads, dim, page, pages_per_seq = 2, 8, 128, 16, 4
    q = torch.randn(batch, heads, dim, generator=g) * 0.05
    k_pages = torch.randn(1, batch * pages_per_seq, page, dim, generator=g)
    v_pages = torch.randn(1, batch * pages_per_seq, page, dim, generator=g)
    page_indices = torch.randperm(batch * pages_per_seq, generator=g).int().reshape(batch, -1)
    lengths = torch.tensor([5, 64], dtype=torch.int32)
    args = (q, k_pages, v_pages, lengths, page_indices)
    dev = torch_xla.device()
    out = paged_attention(*(t.to(dev) for t in args), pages_per_compute_block=2).cpu()
    direct = paged_attention_kernel.paged_attention(
        *(jnp.asarray(t.numpy()) for t in args), pages_per_compute_block=2
    )
    assert torch.equal(out, torch.from_numpy(np.asarray(direct)))
    for b in range(batch):
        keys = k_pages[0, page_indices[b].long()].reshape(-1, dim)[: lengths[b]]
        values = v_pages[0, page_indices[b].long()].reshape(-1, dim)[: lengths[b]]
        expected = torch.softmax(q[b] @ keys.T, dim=-1) @ values
        torch.testing.assert_close(out[b], expected, atol=2e-2, rtol=0)


def test_what_cannot_run_says_so(xlasim_sim):
    need_tpu_compiler()
    import torch_xla

    x = torch.ones(8).to(torch_xla.device())
    # torch_xla 2.9's check, read on PJRT CPU.
    empty = r"^Check failed: inputs.size\(\) > 0: inputs are empty$"
    with pytest.raises(RuntimeError, match=empty):
        torch_xla._XLAC._xla_tpu_custom_call([], "{}", [(8,)], [torch.float32])
    # A Mosaic payload from elsewhere is compiled kernel code, not the kernel's JAX function.
    mosaic = '{"custom_call_config": {"body": "TUzvUgFNTElS", "needs_layout_passes": true}}'
    with pytest.raises(NotImplementedError, match=r"Mosaic payload compiled elsewhere"):
        torch_xla._XLAC._xla_tpu_custom_call([x], mosaic, [(8,)], [torch.float32])


def test_without_the_extra_jax_is_named(xlasim_sim):
    if tpu_compiler_missing() is None:
        pytest.skip("the tpu-compiler extra is installed")
    from torch_xla.experimental.custom_kernel import jax_import_guard, make_kernel_from_pallas

    with pytest.raises(NotImplementedError, match=r"needs the tpu-compiler extra"):
        jax_import_guard()
    kernel = make_kernel_from_pallas(lambda x: x, lambda x: [(x.shape, x.dtype)])
    with pytest.raises(NotImplementedError, match=r"needs the tpu-compiler extra"):
        kernel(torch.ones(2).to("xla"))


def _ragged_inputs(kv_dtype=torch.float32):
    # Three sequences (decode, short prefill, longer prefill) of 4 query heads over 2 key/value
    # heads, pages of 4 positions, padded to 12 token rows and 4 sequences.
    g = torch.Generator().manual_seed(1)
    seqs = [(1, 9), (3, 3), (5, 14)]  # (q_len, kv_len)
    bounds = [0, 1, 4, 9, 9]
    q = torch.randn(12, 4, 8, generator=g)
    kv_pages = torch.randn(20, 4, 4, 8, generator=g).to(kv_dtype)
    kv_lens = torch.tensor([kv for _, kv in seqs] + [0], dtype=torch.int32)
    page_indices = torch.randperm(20, generator=g)[:16].int().reshape(4, 4)
    cu_q_lens = torch.tensor(bounds, dtype=torch.int32)
    num_seqs = torch.tensor([3], dtype=torch.int32)
    return seqs, (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)


def _ragged_written_out(seqs, q, kv_pages, page_indices, sm_scale, sliding_window, soft_cap):
    # The documented semantics (JAX's ragged_paged_attention docstring and reference), one
    # query head and query at a time: keys and values interleaved on the head axis, query
    # head h on key/value head h // 2, a query at position p sees keys p - window < j <= p.
    rows, start = [], 0
    for b, (q_len, kv_len) in enumerate(seqs):
        kv = kv_pages[page_indices[b].long()].reshape(-1, 4, 8)[:kv_len].float()
        for r in range(q_len):
            position = kv_len - q_len + r
            heads = []
            for h in range(4):
                scores = kv[:, 2 * (h // 2)] @ q[start + r, h] * sm_scale
                if soft_cap is not None:
                    scores = soft_cap * torch.tanh(scores / soft_cap)
                seen = torch.arange(kv_len) <= position
                if sliding_window is not None:
                    seen &= torch.arange(kv_len) > position - sliding_window
                weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=0)
                heads.append(weights @ kv[:, 2 * (h // 2) + 1])
            rows.append(torch.stack(heads))
        start += q_len
    return torch.stack(rows)


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize(
    ("sm_scale", "sliding_window", "soft_cap"), [(1.0, None, None), (0.5, 3, 2.0)]
)
def test_ragged_paged_attention(xlasim_sim, use_kernel, sm_scale, sliding_window, soft_cap):
    need_tpu_compiler()
    import jax.numpy as jnp
    import torch_xla
    import torch_xla.backends
    from torch_xla.experimental.custom_kernel import ragged_paged_attention
    from torch_xla.experimental.pallas_kernels import ragged_paged_attention_v2

    seqs, args = _ragged_inputs()
    options = {"sm_scale": sm_scale, "sliding_window": sliding_window, "soft_cap": soft_cap}
    dev = torch_xla.device()
    # float32 products as the written-out attention takes them (the TPU's default rounds
    # the inputs to bfloat16).
    torch_xla.backends.set_mat_mul_precision("highest")
    out = ragged_paged_attention(*(t.to(dev) for t in args), use_kernel=use_kernel, **options).cpu()
    q, kv_pages, _, page_indices, _, _ = args
    expected = _ragged_written_out(seqs, q, kv_pages, page_indices, **options)
    # torch_xla 2.9: the kernel returns q's shape, the op-by-op path the sequences' rows.
    assert out.shape == ((12, 4, 8) if use_kernel else (9, 4, 8))
    torch.testing.assert_close(out[:9], expected, atol=1e-5, rtol=1e-5)
    if use_kernel:
        assert torch.equal(out[9:], torch.zeros(3, 4, 8))
    # The JAX function torch_xla ships under pallas_kernels gives the same on JAX arrays.
    direct = ragged_paged_attention_v2.ragged_paged_attention(
        *(jnp.asarray(t.numpy()) for t in args), **options
    )
    assert direct.shape == (12, 4, 8)
    torch.testing.assert_close(
        torch.from_numpy(np.asarray(direct))[:9], expected, atol=1e-5, rtol=1e-5
    )


def test_ragged_paged_attention_op(xlasim_sim):
    # torch_xla 2.9 registers xla::ragged_paged_attention (and its other kernels) for dynamo:
    # on the device it runs the kernel; off it (fake tensors) it returns an uninitialised
    # tensor like q, warning unless the tensors are meta tensors.
    need_tpu_compiler()
    import torch_xla
    import torch_xla.experimental.custom_kernel  # noqa: F401 - installs the device kernels

    _, args = _ragged_inputs()
    dev = torch_xla.device()
    out = torch.ops.xla.ragged_paged_attention(*(t.to(dev) for t in args), sm_scale=0.5)
    from torch_xla.experimental.custom_kernel import ragged_paged_attention

    expected = ragged_paged_attention(*(t.to(dev) for t in args), sm_scale=0.5)
    assert torch.equal(out.cpu(), expected.cpu())
    with pytest.warns(
        UserWarning, match="^XLA paged attention should only be applied to tensors on XLA device$"
    ):
        off = torch.ops.xla.ragged_paged_attention(*args)
    assert off.shape == args[0].shape
    meta = torch.ops.xla.flash_attention(*(torch.empty(2, 3, 4, device="meta"),) * 3)
    assert meta.shape == (2, 3, 4) and meta.device.type == "meta"
    small = torch.ones(4, 8).to(dev)
    with pytest.raises(NotImplementedError, match=r"custom_kernel\.gmm_xla"):
        torch.ops.xla.gmm(small, torch.ones(1, 8, 4).to(dev), torch.tensor([4]).to(dev))


def test_ragged_paged_attention_refusals(xlasim_sim):
    need_tpu_compiler()
    import torch_xla
    from torch_xla.experimental.custom_kernel import ragged_paged_attention

    dev = torch_xla.device()
    _, args = _ragged_inputs()
    q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = (t.to(dev) for t in args)
    # torch_xla 2.9's op-by-op path checks the lengths when it runs.
    longer = torch.tensor([0, 1, 5, 10, 10], dtype=torch.int32).to(dev)
    with pytest.raises(
        ValueError, match=r"^q_len=.* must be less or equal to kv_len=.* at sequence 1\.$"
    ):
        ragged_paged_attention(
            q, kv_pages, kv_lens, page_indices, longer, num_seqs, use_kernel=False
        )
    # The kernel's own checks (JAX's ragged_paged_attention), raised when it is traced.
    with pytest.raises(ValueError, match=r"must be int32"):
        ragged_paged_attention(q, kv_pages, kv_lens.long(), page_indices, cu_q_lens, num_seqs)
    one_head = torch.zeros(20, 4, 2, 8, dtype=torch.float8_e5m2).to(dev)
    with pytest.raises(ValueError, match=r"can not be XLA fully tiled"):
        ragged_paged_attention(
            q[:, :1].to(torch.bfloat16), one_head, kv_lens, page_indices, cu_q_lens, num_seqs
        )


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("soft_cap", [None, 1.5])
def test_multi_queries_paged_attention(xlasim_sim, use_kernel, soft_cap):
    # Two sequences of 3 query rows (the first 2 and 3 of them effective) of 4 query heads
    # over 2 key/value heads, pages [kv_heads, pages, 4, head_dim]: torch_xla 2.9's
    # documented semantics written out a row and head at a time (row r of sequence b sits at
    # position lengths[b] - effective_q_lens[b] + r and sees the keys up to it).
    need_tpu_compiler()
    import jax.numpy as jnp
    import torch_xla
    import torch_xla.backends
    from torch_xla.experimental.custom_kernel import multi_queries_paged_attention
    from torch_xla.experimental.pallas_kernels import multi_queries_paged_attention_kernel

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 4, 8, generator=g)
    k_pages = torch.randn(2, 6, 4, 8, generator=g)
    v_pages = torch.randn(2, 6, 4, 8, generator=g)
    lengths = torch.tensor([5, 10], dtype=torch.int32)
    page_indices = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    effective = torch.tensor([2, 3], dtype=torch.int32)
    args = (q, k_pages, v_pages, lengths, page_indices, effective)
    blocks = {"num_kv_pages_per_compute_block": 1, "num_queries_per_compute_block": 3}
    expected = torch.zeros(2, 3, 4, 8)
    for b in range(2):
        keys = k_pages[:, page_indices[b].long()].reshape(2, -1, 8)[:, : lengths[b]]
        values = v_pages[:, page_indices[b].long()].reshape(2, -1, 8)[:, : lengths[b]]
        for r in range(3):
            position = int(lengths[b] - effective[b]) + r
            for h in range(4):
                scores = keys[h // 2, : position + 1] @ q[b, r, h]
                if soft_cap is not None:
                    scores = soft_cap * torch.tanh(scores / soft_cap)
                expected[b, r, h] = torch.softmax(scores, 0) @ values[h // 2, : position + 1]
    torch_xla.backends.set_mat_mul_precision("highest")
    dev = torch_xla.device()
    out = multi_queries_paged_attention(
        *(t.to(dev) for t in args), **blocks, use_kernel=use_kernel, attn_logits_soft_cap=soft_cap
    ).cpu()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    direct = multi_queries_paged_attention_kernel.paged_attention(
        *(jnp.asarray(t.numpy()) for t in args), **blocks, attn_logits_soft_cap=soft_cap
    )
    torch.testing.assert_close(torch.from_numpy(np.array(direct)), expected, atol=1e-5, rtol=1e-5)


def test_ragged_paged_attention_op_by_op_needs_no_jax(xlasim_sim):
    # torch_xla 2.9's use_kernel=False path is tensor ops only; through the xla:: op it runs
    # as the program's own calls would, so at the TPU's default precision (float32 products
    # from bfloat16-rounded inputs) it gives exactly what the direct call gives.
    import torch_xla
    from torch_xla.experimental.custom_kernel import ragged_paged_attention

    seqs, args = _ragged_inputs()
    dev = torch_xla.device()
    on_device = [t.to(dev) for t in args]
    out = torch.ops.xla.ragged_paged_attention(*on_device, sliding_window=4, use_kernel=False)
    direct = ragged_paged_attention(*on_device, sliding_window=4, use_kernel=False)
    assert out.shape == (9, 4, 8)
    assert torch.equal(out.cpu(), direct.cpu())
    q, kv_pages, _, page_indices, _, _ = args
    expected = _ragged_written_out(seqs, q, kv_pages, page_indices, 1.0, 4, None)
    torch.testing.assert_close(out.cpu(), expected, atol=5e-2, rtol=0)


def _paged_attention_in_modes():
    # JAX's paged-attention kernel with and without its batch megacore mode, called from JAX after
    # jax_import_guard (as a program does), over 2 key/value heads and 2 sequences.
    from torch_xla.experimental.custom_kernel import jax_import_guard

    jax_import_guard()
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 128, generator=g) * 0.05
    pages = [torch.randn(2, 8, 16, 128, generator=g) for _ in range(2)]
    page_indices = torch.randperm(8, generator=g).int().reshape(2, 4)
    lengths = torch.tensor([7, 64], dtype=torch.int32)
    args = [jnp.asarray(t.numpy()) for t in (q, *pages, lengths, page_indices)]
    return {
        mode: np.asarray(
            paged_attention_kernel.paged_attention(
                *args, pages_per_compute_block=2, megacore_mode=mode
            )
        )
        for mode in ("batch", None)
    }


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_megacore_modes_run_on_a_megacore_chip(xlasim_sim):
    # A v4 device is two TensorCores (megacore): the kernel's megacore modes split its work
    # over them, which changes where it runs, not what it returns (JAX's paged attention).
    need_tpu_compiler()
    out = _paged_attention_in_modes()
    np.testing.assert_allclose(out["batch"], out[None], atol=1e-6, rtol=0)
