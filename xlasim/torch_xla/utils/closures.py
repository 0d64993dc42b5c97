"""``torch_xla.utils.closures``: who runs the step closures ``xm.add_step_closure`` queued.

:class:`AsyncClosureHandler` runs ``run_async`` closures in order on one worker thread, so
the training loop goes on while they run. The worker ends after three idle seconds and a new
one starts with the next closure. A closure that raises ends the worker; the next closure
queued after that is refused with a ``RuntimeError`` that chains the closure's exception.
"""

from __future__ import annotations

import abc
import os
import queue
import threading
from collections.abc import Callable, Iterable

_IDLE_SECONDS = 3  # how long torch_xla's worker waits for another closure before it ends


class ClosureHandler(abc.ABC):
    """Runs the closures of a step; subclasses say how."""

    @abc.abstractmethod
    def run(self, closure: Callable[[], object]) -> None:
        """Runs ``closure``."""

    def run_all(self, closures: Iterable[Callable[[], object]]) -> None:
        for closure in closures:
            self.run(closure)


class AsyncClosureHandler(ClosureHandler):
    """Runs closures on a worker thread; at most ``max_queue_size`` (``XLA_MAX_ASYNC_QUEUE``
    when set) wait at once, after which :meth:`run` blocks."""

    def __init__(self, max_queue_size: int = 100) -> None:
        super().__init__()
        size = int(os.environ.get("XLA_MAX_ASYNC_QUEUE", max_queue_size))
        self._closure_queue: queue.Queue[Callable[[], object]] = queue.Queue(size)
        self._closure_exception: queue.Queue[BaseException] = queue.Queue()
        self._closure_lock = threading.Lock()
        self._closure_event_loop_finished = threading.Event()
        self._closure_event_loop: threading.Thread | None = None

    def _work(self) -> None:
        while True:
            try:
                closure = self._closure_queue.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._closure_lock:  # run() cannot queue one between the check and the end
                    if self._closure_queue.empty():
                        self._closure_event_loop_finished.set()
                        return
                continue
            try:
                closure()
            except Exception as e:
                self._closure_exception.put(e)
                return
            self._closure_queue.task_done()

    def start_event_loop(self) -> None:
        """Starts the worker thread unless one was started."""
        if self._closure_event_loop is None:
            self._closure_event_loop = threading.Thread(target=self._work)
            self._closure_event_loop.start()

    def run(self, closure: Callable[[], object]) -> None:
        with self._closure_lock:
            self._closure_queue.put(closure)
            worker = self._closure_event_loop
            if worker is not None and worker.is_alive():
                return
            try:
                failure = self._closure_exception.get_nowait()
            except queue.Empty:
                self._closure_event_loop = None
                self.start_event_loop()
                return
            raise RuntimeError(
                "Cannot run asynchronous closure due to previously raised exception"
            ) from failure
