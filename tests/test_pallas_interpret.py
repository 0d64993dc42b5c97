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
