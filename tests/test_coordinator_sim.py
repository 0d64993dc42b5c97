"""The coordinator bindings on a fresh simulated runtime: what fails before
``_ensure_xla_coordinator_initialized``, and what the simulator cannot agree on.

The messages are real torch_xla 2.9's (PJRT CPU) for the same calls in a fresh process; a
fresh process is what the conformance suite cannot give each test on the real side.
"""

from __future__ import annotations

import signal
import threading

import pytest


def test_preemption_bindings_need_the_coordinator(xlasim_sim):
    import torch_xla

    xlac = torch_xla._XLAC
    message = r"Check failed: client->CoordinatorInitialized\(\): Coordinator must be initialized"
    with pytest.raises(RuntimeError, match=message):
        xlac._sync_point_reached(1)
    with pytest.raises(RuntimeError, match=message):
        xlac._activate_preemption_sync_manager()
    xlac._deactivate_preemption_sync_manager()  # nothing to deactivate: allowed


def test_sigterm_handler_is_restored_on_deactivation(xlasim_sim):
    import torch_xla

    xlac = torch_xla._XLAC
    before = signal.getsignal(signal.SIGTERM)
    xlac._ensure_xla_coordinator_initialized(0, 1, "localhost")
    xlac._ensure_xla_coordinator_initialized(3, 8, "elsewhere")  # the first call's stay
    xlac._activate_preemption_sync_manager()
    xlac._activate_preemption_sync_manager()  # already active: the same watcher
    assert signal.getsignal(signal.SIGTERM) is not before
    xlac._deactivate_preemption_sync_manager()
    assert signal.getsignal(signal.SIGTERM) == before


def test_agreement_between_processes_is_not_simulated(xlasim_sim):
    import torch_xla

    xlac = torch_xla._XLAC
    xlac._ensure_xla_coordinator_initialized(0, 2, "localhost")
    with pytest.raises(NotImplementedError, match="agreed between 2 processes"):
        xlac._activate_preemption_sync_manager()


def test_activation_off_the_main_thread_is_not_simulated(xlasim_sim):
    import torch_xla

    xlac = torch_xla._XLAC
    xlac._ensure_xla_coordinator_initialized(0, 1, "localhost")
    errors: list[BaseException] = []

    def activate() -> None:
        try:
            xlac._activate_preemption_sync_manager()
        except BaseException as exc:  # handed to the main thread to assert on
            errors.append(exc)

    worker = threading.Thread(target=activate)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "activation thread did not finish within 30 s"
    assert len(errors) == 1 and isinstance(errors[0], NotImplementedError)
    assert "main thread" in str(errors[0])
