"""``torch_xla.core.functions``: collectives that autograd can differentiate through.

They call the ``xm`` collectives, so they work (and fail) wherever those do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr


def _sum_gradient(grad: torch.Tensor, inputs: torch.Tensor, reduced: torch.Tensor) -> Any:
    return grad


def _product_gradient(grad: torch.Tensor, inputs: torch.Tensor, reduced: torch.Tensor) -> Any:
    # d(prod)/d(x_i) = prod / x_i, taken as 0 where x_i is 0.
    return grad * torch.where(inputs != 0, reduced / inputs, torch.zeros_like(inputs))


def _extremum_gradient(grad: torch.Tensor, inputs: torch.Tensor, reduced: torch.Tensor) -> Any:
    # Only the replicas whose value is the min (max) receive the gradient.
    return torch.where(inputs == reduced, grad, torch.zeros_like(grad))


# The input's gradient for each reduce type that has one; any other fails in the backward.
_INPUT_GRADIENTS = {
    xm.REDUCE_SUM: _sum_gradient,
    xm.REDUCE_MUL: _product_gradient,
    xm.REDUCE_MIN: _extremum_gradient,
    xm.REDUCE_MAX: _extremum_gradient,
}


class AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, reduce_type: str, scale: float, groups: Any) -> Any:  # noqa: A002
        reduced = xm.all_reduce(reduce_type, input, scale=scale, groups=groups)
        ctx.save_for_backward(input, reduced)
        ctx.options = (reduce_type, scale)
        return reduced

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        reduce_type, scale = ctx.options
        gradient = _INPUT_GRADIENTS.get(reduce_type)
        if gradient is None:
            raise RuntimeError(f"Unsupported reduce type: {reduce_type}")
        grad = grad_output if scale == 1.0 else grad_output * scale
        return gradient(grad, *ctx.saved_tensors), None, None, None


def all_reduce(
    reduce_type: str, value: torch.Tensor, scale: float = 1.0, groups: Any = None
) -> Any:
    """``xm.all_reduce`` with a gradient."""
    return AllReduce.apply(value, reduce_type, scale, groups)


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, dim: int) -> Any:  # noqa: A002
        ctx.dim = dim
        ctx.ordinal = xr.global_ordinal()
        ctx.world_size = xr.world_size()
        return xm.all_gather(input, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        # The gradient of this replica's slice of the gathered tensor.
        size = grad_output.size(ctx.dim) // ctx.world_size
        return torch.narrow(grad_output.clone(), ctx.dim, ctx.ordinal * size, size), None


def all_gather(value: torch.Tensor, dim: int = 0) -> Any:
    """``xm.all_gather`` along ``dim`` with a gradient."""
    return AllGather.apply(value, dim)


def distributed_mm(w: torch.Tensor, x: torch.Tensor, split: int = 1) -> torch.Tensor:
    """``w @ x`` where each replica holds ``w``'s columns for its slice of ``x``'s rows
    (``w``: N x Ko, ``x``: (Ko * world_size) x M); ``split`` gathers ``x`` in that many column
    chunks to bound memory."""
    rank, k = xr.global_ordinal(), w.size(1)
    assert x.size(0) // xr.world_size() == k
    assert split == 1 or x.size(1) % split == 0
    chunks = [x] if split == 1 else list(torch.split(x, x.size(1) // split, dim=1))

    def product(chunk: torch.Tensor) -> torch.Tensor:
        # Every replica's chunk side by side, this replica's rows of them against its w, summed
        # over replicas, then this replica's own columns of the sum.
        own_rows = all_gather(chunk, dim=1).narrow(0, rank * k, k)
        summed = all_reduce(xm.REDUCE_SUM, w @ own_rows)
        return summed.narrow(1, rank * chunk.size(1), chunk.size(1))

    parts = [product(c) for c in chunks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class SyncBatchNorm(torch.nn.Module):
    """Batch norm whose training statistics are averaged over replicas.

    Normalizes with the biased batch variance and also keeps that (not the unbiased one) in
    ``running_var``, as torch_xla's does.
    """

    weight: torch.nn.Parameter
    bias: torch.nn.Parameter
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        # Starts as the identity transform, with the statistics of a standard normal.
        for name, fill in (("weight", 1.0), ("bias", 0.0)):
            self.register_parameter(name, torch.nn.Parameter(self._per_channel(fill)))
        for name, fill in (("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(name, self._per_channel(fill))

    def _per_channel(self, fill: float) -> torch.Tensor:
        return torch.full((self.num_features,), fill)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        assert 2 <= batch.ndim <= 5 and batch.shape[1] == self.num_features
        if self.training:
            others = [d for d in range(batch.ndim) if d != 1]
            per_replica = 1.0 / xr.world_size()
            mean = AllReduceSumLayer.apply(batch.mean(dim=others)) * per_replica
            mean_sq = AllReduceSumLayer.apply((batch * batch).mean(dim=others)) * per_replica
            var = mean_sq - mean.pow(2)
            keep = 1 - self.momentum
            self.running_mean = keep * self.running_mean + self.momentum * mean
            self.running_var = keep * self.running_var + self.momentum * var
        else:
            mean, var = self.running_mean, self.running_var
        # Per-channel vectors broadcast along dim 1; elementwise, so the values are those of a
        # channel-by-channel loop.
        channel = (1, self.num_features) + (1,) * (batch.ndim - 2)

        def per_channel(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(channel)

        normed = (batch - per_channel(mean)) / torch.sqrt(per_channel(var) + self.eps)
        return normed * per_channel(self.weight) + per_channel(self.bias)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class AllReduceSumLayer(torch.autograd.Function):
    """Sum over replicas, forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> Any:
        return xm.all_reduce(xm.REDUCE_SUM, x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return xm.all_reduce(xm.REDUCE_SUM, grad_output)
