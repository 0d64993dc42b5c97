"""An 8B-parameter Llama-shaped training step, written as a torch_xla 2.9 SPMD program.

Plain user code, nothing simulator-specific: the model is built on the CPU and moved with
``.to(device)``, every weight matrix is sharded FSDP-style (its first dimension split over all
devices of a one-axis mesh) with ``xs.mark_sharding``, the batch is split the same way, and the
step is forward, backward and AdamW, cut by ``torch_xla.sync()``.

Llama-3-8B's shapes by default (32 layers, width 4096, MLP 14336, 32 query heads, 8 key/value
heads, vocabulary 128256: 8.03B parameters, 16 GB in bfloat16).  On this machine it only runs
as a dry run, where no value is computed::

    xlasim run --topology 4x8x8 --accelerator v5p --single-process --dry-run \\
        -- python bench/dry_run_8b.py
    xlasim run --topology 4x8x8 --accelerator v5p --single-process --dry-run \\
        --compiler libtpu -- python bench/dry_run_8b.py --steps 1

Smaller versions: ``--layers 2 --dim 512 ...``.  On a real slice it is the same program.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def rotary_tables(seq: int, head_dim: int, theta: float = 500000.0) -> torch.Tensor:
    """cos and sin of the rotary angles, shape (2, seq, head_dim)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.stack([angles.cos(), angles.sin()])


def rotate(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * tables[0].to(x.dtype) + turned * tables[1].to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, tables: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, tables), rotate(k, tables)
        # Grouped-query attention: each key/value head serves heads / kv_heads query heads.
        group = self.heads // self.kv_heads
        shape = (batch, self.kv_heads, group, seq, self.head_dim)
        k = k[:, :, None].expand(shape).reshape(batch, self.heads, seq, self.head_dim)
        v = v[:, :, None].expand(shape).reshape(batch, self.heads, seq, self.head_dim)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask.to(q.dtype)
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.wo(out.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads, kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, tables: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), tables, mask)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(
        self, vocab: int, dim: int, layers: int, hidden: int, heads: int, kv_heads: int, seq: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, hidden, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("tables", rotary_tables(seq, dim // heads), persistent=False)
        self.register_buffer(
            "mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.tables, self.mask)
        return self.output(self.norm(x))


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch-per-device", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    xr.use_spmd()
    devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(devices), (devices,), ("fsdp",))
    device = torch_xla.device()

    start = time.perf_counter()
    model = Llama(
        args.vocab, args.dim, args.layers, args.hidden, args.heads, args.kv_heads, args.seq
    )
    model = model.to(torch.bfloat16).to(device)
    built = time.perf_counter() - start
    # FSDP-style: every weight matrix split over all devices along its first dimension; the
    # norms' vectors are small and stay replicated.
    for param in model.parameters():
        if param.dim() == 2:
            xs.mark_sharding(param, mesh, ("fsdp", None))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batch = args.batch_per_device * devices
    print(
        f"{params:,} parameters, {args.layers} layers, built and moved in {built:.1f}s; "
        f"{devices} devices, batch {batch} x {args.seq} tokens",
        flush=True,
    )

    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1)).to(device)
        xs.mark_sharding(tokens, mesh, ("fsdp", None))
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        optimizer.step()
        start = time.perf_counter()
        torch_xla.sync()
        print(f"step {step}: synced in {time.perf_counter() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
