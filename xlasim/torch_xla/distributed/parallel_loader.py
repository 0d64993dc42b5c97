"""Simulated ``torch_xla.distributed.parallel_loader``.

Batches are moved to the device on the caller's thread (the real loader uses background
threads only to overlap transfers; the order and values are the same), and each ``next()``
marks a step boundary with ``torch_xla.sync()`` as the real ``MpDeviceLoader`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm


class PerDeviceLoader:
    def __init__(
        self,
        loader: Iterable[Any],
        device: Any,
        input_sharding: Any = None,
        batches_per_execution: int = 1,
    ) -> None:
        self._loader = loader
        self._device = device
        self._input_sharding = input_sharding
        self._batches_per_step = batches_per_execution
        self._iter: Iterator[Any] | None = None
        self._served = 0  # next() calls since iteration (re)started

    def __iter__(self) -> PerDeviceLoader:
        self._iter = iter(self._loader)
        self._served = 0
        return self

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def next(self) -> Any:
        # Named as torch_xla's method (``__next__`` is it): PT_XLA_DEBUG tells the step-end
        # syncs by this name on the stack.
        if self._iter is None:
            self.__iter__()
        assert self._iter is not None
        # Step boundaries as in torch_xla: a sync before every `batches_per_execution`-th
        # batch (before each one when that is 1), and one more when the loader runs out.
        self._served += 1
        per_step = self._batches_per_step
        if per_step <= 1 or self._served % per_step == 0:
            torch_xla.sync()
        try:
            batch = next(self._iter)
        except StopIteration:
            torch_xla.sync()
            raise
        return _send_batch(batch, self._device, self._input_sharding)

    __next__ = next


def _send_batch(batch: Any, device: Any, input_sharding: Any) -> Any:
    """One batch on ``device``, shaped as it came from the loader.

    ``input_sharding`` is one ``ShardingSpec`` for every tensor of the batch, or a dict giving
    each key of a dict batch its own spec (an empty dict shards nothing); a key without a spec
    is a ``KeyError`` naming every such key, raised once the batch's other keys are moved.
    """
    if not isinstance(input_sharding, dict):
        # A loader's batches go over as a list, so a lone tensor comes back unwrapped.
        return xm.send_cpu_data_to_device([batch], device, input_sharding)[0]
    if not isinstance(batch, dict):
        raise ValueError("input batch should be a dict when input sharding is a dict.")
    moved: dict[Any, Any] = {}
    missing = []
    for key, tensor in batch.items():
        assert type(tensor) is torch.Tensor
        if input_sharding and key not in input_sharding:
            missing.append(key)
            continue
        spec = input_sharding.get(key)
        moved[key] = xm.send_cpu_data_to_device(tensor, device, spec)[0]
    if missing:
        raise KeyError(f"Keys: {missing} are missing from input_sharding.")
    return moved


class MpDeviceLoader:
    """Wraps a loader so each batch arrives on ``device`` and steps are synced per batch."""

    def __init__(self, loader: Iterable[Any], device: Any, **kwargs: Any) -> None:
        allowed = {
            "input_sharding",
            "batches_per_execution",
            "loader_prefetch_size",
            "device_prefetch_size",
            "host_to_device_transfer_threads",
            "loader_prefetch_threads",
            "batchdim",
            "fixed_batch_size",
        }
        unknown = set(kwargs) - allowed
        if unknown:
            raise TypeError(f"MpDeviceLoader got unexpected keyword arguments {sorted(unknown)}")
        self._loader = loader
        self._device = torch.device(device)
        self._kwargs = kwargs

    def __iter__(self) -> PerDeviceLoader:
        return iter(
            PerDeviceLoader(
                self._loader,
                self._device,
                input_sharding=self._kwargs.get("input_sharding"),
                batches_per_execution=self._kwargs.get("batches_per_execution", 1),
            )
        )

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]


class ParallelLoader:
    def __init__(self, cpu_loader: Iterable[Any], devices: list[Any], **kwargs: Any) -> None:
        self._cpu_loader = cpu_loader
        self._devices = [torch.device(d) for d in devices]
        self._kwargs = kwargs

    def per_device_loader(self, device: Any) -> PerDeviceLoader:
        return PerDeviceLoader(
            self._cpu_loader,
            torch.device(device),
            input_sharding=self._kwargs.get("input_sharding"),
        )

    def per_device_samples(self) -> int:
        return len(self._cpu_loader) // len(self._devices)  # type: ignore[arg-type]
