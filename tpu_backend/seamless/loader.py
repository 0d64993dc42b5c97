"""Data loaders that yield batches on the device, each process loading its share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from tpu_backend.seamless.device import move

__all__ = ["BatchSharding", "DeviceBatches", "distribute"]


class DeviceBatches:
    """Iterates a CPU loader, yielding batches on ``device`` (non-XLA devices)."""

    def __init__(self, loader: Any, device: Any) -> None:
        self.loader = loader
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield move(batch, self.device)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)


class BatchSharding:
    """``input_sharding`` for ``MpDeviceLoader``: dim 0 over the mesh's data axis.

    With ``minibatch`` each host passes its own part of the global batch (torch_xla
    concatenates the hosts' parts in device order), and dim 0 is split over all the mesh's
    devices, data axis major.

    One ``ShardingSpec`` per tensor rank, because a batch mixes ranks (images and labels)
    and torch_xla leaves a tensor whose rank differs from the spec's unsharded.  torch_xla
    calls ``xla_spec(t)`` and reads ``minibatch`` on it, nothing else.
    """

    def __init__(self, mesh: Any, minibatch: bool) -> None:
        self.mesh = mesh
        self.minibatch = minibatch
        names = getattr(mesh, "axis_names", None)
        self.axis: Any = names[0] if names else 0
        self._specs: dict[int, Any] = {}

    def spec_for(self, rank: int) -> Any:
        spec = self._specs.get(rank)
        if spec is None:
            # Deferred: made on XLA only, where torch_xla is already imported.
            import torch_xla.distributed.spmd as xs

            mesh = self.mesh
            if (rank == 1 or self.minibatch) and len(mesh.mesh_shape) > 1:
                # torch_xla 2.9 takes a spec with no None entry as fully tiled over the whole
                # mesh, so ('data',) on a 2-D mesh fails in the transfer (IndexError); and it
                # assembles per-host (minibatch) batches only along a batch dim tiled over
                # every device ("Minibatch sharding only supports sharding along the batch
                # dimension").  The same devices in the same order as one axis shard the
                # batch dim instead: a row-major flatten keeps the data axis major, so the
                # global order holds (host-major device ids: host 0's rows come first).
                names = (self.axis,) if isinstance(self.axis, str) else None
                mesh = xs.Mesh(mesh.device_ids, (len(mesh.device_ids),), names)
            spec = xs.ShardingSpec(mesh, (self.axis,) + (None,) * (rank - 1), self.minibatch)
            self._specs[rank] = spec
        return spec

    @property
    def partition_spec(self) -> tuple[Any, ...]:
        return (self.axis,)

    def can_apply(self, t: Any) -> bool:
        return t.dim() > 0

    def xla_spec(self, t: Any) -> Any:
        if t.dim() == 0:
            return None
        return self.spec_for(t.dim()).xla_spec(t)

    def __bool__(self) -> bool:
        return True


def distribute(loader: Any, num_loaders: int, rank: int) -> Any:
    """Give a plain DataLoader a DistributedSampler when several processes load data."""
    if num_loaders <= 1 or not isinstance(loader, DataLoader):
        return loader
    if isinstance(loader.sampler, DistributedSampler) or loader.batch_sampler is None:
        return loader
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=num_loaders,
        rank=rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
        drop_last=loader.drop_last,
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers,
    )
