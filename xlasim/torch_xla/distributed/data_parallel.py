"""Simulated ``torch_xla.distributed.data_parallel``: a model replicated over devices, one
Python thread per device (torch_xla's legacy single-process multi-device mode).

The simulator runs it for one device; with several, the simulated ``ParallelLoader`` would hand
every device the whole input rather than its share, so that case raises NotImplementedError.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl


class Context:
    """Per-device state that lives as long as the ``DataParallel`` object."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def getattr_or(self, name: str, defval: Any) -> Any:
        """Attribute ``name``, first set to ``defval`` (or ``defval()`` if callable)."""
        value = getattr(self, name, None)
        if value is None:
            value = defval() if callable(defval) else defval
            setattr(self, name, value)
        return value


class ThreadResult:
    def __init__(self) -> None:
        self.result: Any = None


class DataParallel:
    """Runs ``loop_fn`` on a copy of ``network`` (a module, or a callable making one) per
    device of ``device_ids`` (default: every XLA device); no devices runs it on the CPU."""

    def __init__(self, network: Any, device_ids: list[Any] | None = None, **kwargs: Any) -> None:
        if device_ids is None:
            device_ids = xm.get_xla_supported_devices()
        self._device_ids = [str(d) for d in device_ids]
        self._kwargs = kwargs
        module = network if isinstance(network, torch.nn.Module) else network()
        # No devices: the network runs where its parameters are (natively, on the CPU).
        self._native_run = not device_ids
        places = self._device_ids if device_ids else [self._get_model_device(module)]
        if self._native_run:
            self._device_ids = places
            self._models = [module]
        else:
            self._models = [copy.deepcopy(module).to(device=torch.device(d)) for d in places]
        self._contexts = [Context(torch.device(d)) for d in places]

    @property
    def devices(self) -> list[str]:
        return self._device_ids

    @property
    def models(self) -> list[torch.nn.Module]:
        return self._models

    def _get_model_device(self, model: torch.nn.Module) -> str:
        devices = {str(p.device) for p in model.parameters()}
        if len(devices) > 1:
            raise RuntimeError(f"Model uses more than one device: {list(devices)}")
        return devices.pop() if devices else "cpu"

    def _handle_runner_exception(self, device: str, e: Exception) -> None:
        print(f"Exception in model function for device={device}: {e}", file=sys.stderr)
        traceback.print_exc(limit=16, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # As in torch_xla: the other replicas would wait forever on the failed one.
        os._exit(17)

    def _module_runner(
        self,
        loop_fn: Callable[..., Any],
        device: str,
        module: torch.nn.Module,
        loader: Any,
        context: Context,
        result: ThreadResult,
        **kwargs: Any,
    ) -> None:
        xm.set_replication(device, self._device_ids)
        try:
            result.result = loop_fn(module, loader, torch.device(device), context, **kwargs)
        except Exception as e:
            result.result = e
            self._handle_runner_exception(device, e)

    def __call__(
        self, loop_fn: Callable[..., Any], loader: Any, batchdim: int = 0, **kwargs: Any
    ) -> list[Any]:
        """Runs one epoch: ``loop_fn(model, device_loader, device, context)`` on each device's
        thread; returns what each returned."""
        if self._native_run:
            return [
                loop_fn(
                    self._models[0],
                    enumerate(loader),
                    torch.device(self._device_ids[0]),
                    self._contexts[0],
                    self._kwargs,
                )
            ]
        if len(self._device_ids) > 1:
            raise NotImplementedError(
                f"xlasim runs DataParallel on one device only, not {len(self._device_ids)} "
                f"(its ParallelLoader does not split batches across devices)"
            )
        xm.wait_device_ops()
        para_loader = pl.ParallelLoader(loader, self._device_ids, batchdim=batchdim, **self._kwargs)
        runs = []
        for module, device, context in zip(
            self._models, self._device_ids, self._contexts, strict=True
        ):
            result = ThreadResult()
            thread = threading.Thread(
                target=self._module_runner,
                args=(
                    loop_fn,
                    device,
                    module,
                    para_loader.per_device_loader(device),
                    context,
                    result,
                ),
                kwargs=kwargs,
                daemon=True,
            )
            thread.start()
            runs.append((thread, result))
        for thread, _ in runs:
            thread.join()
        return [result.result for _, result in runs]
