"""``torch.tpu``'s functions: one TPU device per process, eager, on the simulated slice.

TorchTPU binds one device to a process: ``set_device`` only checks that it is given that
device, and the RNG functions only accept it. Every op has finished when it returns (the
simulated device computes eagerly on the host), so synchronizing waits for nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch_tpu._internal.precision as _precision
from torch_tpu._internal.stream import streams
from torch_tpu._internal.utils import hardware

from xlasim.runtime import tpu_device

# The dtypes TorchTPU lets autocast use (its get_amp_supported_dtype()).
_AMP_SUPPORTED_DTYPES = (
    torch.bfloat16,
    torch.bool,
    torch.complex128,
    torch.complex64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.uint8,
)


def _check_rng_device(device: int | str | torch.device, index: int) -> None:
    given_type: str | None = None
    given_index: int | None = None
    if isinstance(device, str):
        given_type = device
    elif isinstance(device, torch.device):
        given_type, given_index = device.type, device.index
    elif isinstance(device, int):
        given_index = device
    else:
        raise TypeError(f"got unrecognized device type: {device}")
    if given_type is not None and given_type != "tpu":
        raise ValueError(f"expected device type 'tpu' for RNG state access, got '{given_type}'")
    if given_index is not None and given_index != index:
        raise ValueError(
            f"expected local device index {index}, got {given_index}:"
            " accessing RNG state of a non-current TPU device is not supported"
        )


@dataclasses.dataclass(frozen=True)
class _TpuDeviceProperties:
    """A TPU device's static properties; ``total_memory`` is the HBM one device addresses."""

    name: str
    total_memory: int
    multi_processor_count: int = 1


class TpuDeviceModule:
    """The functions ``torch.tpu`` exports (its private ``_`` names are served from here too)."""

    _device_type = "tpu"
    _autocast_enabled = False
    _autocast_dtype: torch.dtype | None = torch.bfloat16

    precision = staticmethod(_precision.precision)
    Precision = _precision.Precision

    @classmethod
    def device_count(cls) -> int:
        """Devices of this process: TorchTPU binds one, once loaded in this simulation. A later
        simulation that has not loaded TorchTPU has no tpu device, even on a host with chips:
        torch asks the renamed PrivateUse1 module for the rest of the process (torch.manual_seed,
        torch.distributed.checkpoint's loaders), and must not find one there."""
        return tpu_device.device_count()

    @classmethod
    def is_available(cls) -> bool:
        return cls.device_count() > 0

    @classmethod
    def is_initialized(cls) -> bool:
        return tpu_device.device_count() > 0

    @classmethod
    def current_device(cls) -> int:
        return torch.accelerator.current_device_index()

    @classmethod
    def set_device(cls, device: int | str | torch.device) -> None:
        """Checks that ``device`` is this process's device (it cannot change)."""
        current = torch.accelerator.current_device_index()
        if isinstance(device, str):
            if device != "tpu":
                raise ValueError(f"Invalid device string {device}")
            given = current
        elif isinstance(device, torch.device):
            if device.type != "tpu":
                raise ValueError(f"Invalid device type {device.type}")
            given = device.index if device.index is not None else current
        elif isinstance(device, int):
            given = device
        else:
            raise TypeError(f"Got unrecognized device type, {device}")
        if given != current:
            raise ValueError(
                f"Cannot set TPU device to index {given}, current process is "
                f"bound to device index {current}. Changing the active TPU "
                "device within a process is not supported."
            )

    @classmethod
    def synchronize(cls, device: int | None = None) -> None:
        """Nothing to wait for: the simulated device has finished every op it was given."""

    @classmethod
    def Stream(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> streams.TpuStream:  # noqa: N802
        return streams.TpuStream(device=device, priority=priority, **kwargs)

    @classmethod
    def Event(  # noqa: N802
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
        device: Any = None,
    ) -> streams.TpuEvent:
        return streams.TpuEvent(
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
            external=external,
            device=device,
        )

    @classmethod
    def stream(cls, stream: streams.TpuStream | None) -> streams.TpuStreamContext:
        return streams.TpuStreamContext(stream)

    @classmethod
    def set_stream(cls, stream: streams.TpuStream) -> None:
        streams.set_current_stream_id(stream.stream_id, stream.device_index)

    @classmethod
    def current_stream(cls, device: torch.device | None = None) -> streams.TpuStream:
        device = torch.device("tpu") if device is None else device
        index = streams.device_index(device)
        return streams.TpuStream(device=device, stream_id=streams.current_stream_id(index))

    @classmethod
    def default_stream(cls, device: torch.device | None = None) -> streams.TpuStream:
        return streams.TpuStream(
            device=torch.device("tpu") if device is None else device, stream_id=0
        )

    @classmethod
    def _generator(cls) -> torch.Generator:
        return tpu_device.default_generator(torch.accelerator.current_device_index())

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        # torch.manual_seed seeds the renamed PrivateUse1 device's module too, in every later
        # simulation of the process, also one that never loaded TorchTPU: without an attached
        # device there is no generator to seed, as torch.cuda.manual_seed without a GPU.
        if not cls.is_initialized():
            return
        cls._generator().manual_seed(int(seed))

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        cls.manual_seed(seed)  # one device per process

    @classmethod
    def initial_seed(cls) -> int:
        return cls._generator().initial_seed()

    @classmethod
    def get_rng_state(cls, device: int | str | torch.device = "tpu") -> torch.Tensor:
        _check_rng_device(device, torch.accelerator.current_device_index())
        return cls._generator().get_state()

    @classmethod
    def set_rng_state(
        cls, new_state: torch.Tensor, device: int | str | torch.device = "tpu"
    ) -> None:
        _check_rng_device(device, torch.accelerator.current_device_index())
        cls._generator().set_state(new_state)

    @classmethod
    def _default_generators(cls) -> tuple[torch.Generator, ...]:
        return tuple(tpu_device.default_generator(i) for i in range(cls.device_count()))

    @classmethod
    def _get_generator(cls, device: torch.device) -> torch.Generator:
        index = device.index if device.index is not None else cls.current_device()
        return cls._default_generators()[index]

    @classmethod
    def get_device_name(cls, device: int | str | torch.device | None = None) -> str:
        return hardware.get_tpu_device_name()

    @classmethod
    def get_device_properties(
        cls, device: int | str | torch.device | None = None
    ) -> _TpuDeviceProperties:
        total_memory = hardware.get_hbm_bytes_per_device()
        name = cls.get_device_name(device)
        if total_memory is None:
            raise RuntimeError(f"unrecognized TPU {name!r}; cannot determine device memory")
        return _TpuDeviceProperties(name=name, total_memory=total_memory)

    @classmethod
    def get_amp_supported_dtype(cls) -> list[torch.dtype]:
        return list(_AMP_SUPPORTED_DTYPES)

    # What PyTorch itself asks a PrivateUse1 device module.
    @classmethod
    def _lazy_init(cls) -> None:
        pass

    @classmethod
    def _is_in_bad_fork(cls) -> bool:
        return False

    @classmethod
    def _is_autocast_enabled(cls) -> bool:
        return cls._autocast_enabled

    @classmethod
    def _get_autocast_dtype(cls) -> torch.dtype | None:
        return cls._autocast_dtype

    @classmethod
    def _set_autocast_enabled(cls, enabled: bool) -> None:
        cls._autocast_enabled = enabled

    @classmethod
    def _set_autocast_dtype(cls, dtype: torch.dtype) -> None:
        supported = cls.get_amp_supported_dtype()
        if dtype not in supported:
            raise ValueError(
                f"Unsupported dtype {dtype} for AMP. Supported dtypes are: {supported}"
            )
        cls._autocast_dtype = dtype


class _DeviceContext:
    """``torch.tpu.device(d)``: selects ``d``, which must be this process's device."""

    def __init__(self, device: Any) -> None:
        self._idx = -1 if device is None else torch._utils._get_device_index(device, True)

    def __enter__(self) -> None:
        if self._idx >= 0:
            TpuDeviceModule.set_device(self._idx)

    def __exit__(self, *exc: object) -> None:
        pass


class _DeviceOfContext(_DeviceContext):
    """``torch.tpu.device_of(t)``: the device of ``t`` when it is a tpu tensor."""

    def __init__(self, obj: Any) -> None:
        on_tpu = getattr(getattr(obj, "device", None), "type", None) == "tpu"
        super().__init__(obj.get_device() if on_tpu else None)


def get_device_module(device_type: str) -> type[TpuDeviceModule]:
    if device_type != "tpu":
        raise ValueError(f"Unknown device type {device_type!r}, only 'tpu' is supported.")
    return TpuDeviceModule
