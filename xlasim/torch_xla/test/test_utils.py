"""Simulated ``torch_xla.test.test_utils``: helpers torch_xla's own tests and examples use."""

from __future__ import annotations

import multiprocessing
import time
import unittest
from collections.abc import Callable
from datetime import datetime
from typing import Any

import torch_xla.runtime as xr


def mp_test(func: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a test method in a child process of its own; a ``unittest.TestCase`` method then
    asserts that the child exited with 0. Returns the child's exit code."""

    def in_child(*args: Any, **kwargs: Any) -> int | None:
        child = multiprocessing.Process(target=func, args=args, kwargs=kwargs)
        child.start()
        child.join()
        if args and isinstance(args[0], unittest.TestCase):
            args[0].assertEqual(child.exitcode, 0)
        return child.exitcode

    return in_child


def _get_device_spec(device: Any) -> str:
    ordinal = xr.global_ordinal()
    return str(device) if ordinal < 0 else f"{device}/{ordinal}"


def write_to_summary(
    summary_writer: Any,
    global_step: int | None = None,
    dict_to_write: dict[str, Any] = {},  # noqa: B006 - the real signature
    write_xla_metrics: bool = False,
) -> None:
    """Adds each scalar of ``dict_to_write`` to a TensorBoard writer (None: does nothing)."""
    if summary_writer is None:
        return
    for name, value in dict_to_write.items():
        summary_writer.add_scalar(name, value, global_step)
    if write_xla_metrics:
        raise NotImplementedError(
            "xlasim does not write its metrics to TensorBoard (write_xla_metrics=True)"
        )


def close_summary_writer(summary_writer: Any) -> None:
    if summary_writer is not None:
        summary_writer.flush()
        summary_writer.close()


def get_summary_writer(logdir: str | None) -> Any:
    """A tensorboardX writer logging to ``logdir`` (None when no directory is given)."""
    if not logdir:
        return None
    from tensorboardX import SummaryWriter  # type: ignore[import-untyped] # optional, as in torch_xla

    writer = SummaryWriter(log_dir=logdir)
    write_to_summary(writer, 0, dict_to_write={"TensorboardStartTimestamp": time.time()})
    return writer


def now(format: str = "%H:%M:%S") -> str:  # noqa: A002 - the real signature
    return datetime.now().strftime(format)


def _print_update(fields: list[str | None]) -> None:
    print("|", " ".join(f for f in fields if f), flush=True)


def print_training_update(
    device: Any,
    step: int,
    loss: float,
    rate: float,
    global_rate: float,
    epoch: int | None = None,
    summary_writer: Any = None,
) -> None:
    _print_update(
        [
            "Training",
            f"Device={_get_device_spec(device)}",
            None if epoch is None else f"Epoch={epoch}",
            f"Step={step}",
            f"Loss={loss:.5f}",
            f"Rate={rate:.2f}",
            f"GlobalRate={global_rate:.2f}",
            f"Time={now()}",
        ]
    )
    if summary_writer:
        write_to_summary(
            summary_writer,
            dict_to_write={"examples/sec": rate, "average_examples/sec": global_rate},
        )


def print_test_update(
    device: Any, accuracy: float | None, epoch: int | None = None, step: int | None = None
) -> None:
    _print_update(
        [
            "Test",
            f"Device={_get_device_spec(device)}",
            None if step is None else f"Step={step}",
            None if epoch is None else f"Epoch={epoch}",
            None if accuracy is None else f"Accuracy={accuracy:.2f}",
            f"Time={now()}",
        ]
    )
