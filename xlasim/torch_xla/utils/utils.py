"""``torch_xla.utils.utils``: small helpers that torch_xla's modules, examples and clients use.

Plain Python with nothing to simulate; behaviour (return values, iteration and the environment
variables read) is torch_xla 2.9's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

from xlasim.runtime.settings import xla_env_flag


class Cleaner:
    """Calls ``func`` when the object is garbage collected."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __del__(self) -> None:
        self.func()


class LazyProperty:
    """``value`` is ``gen_fn()``, computed on first access."""

    def __init__(self, gen_fn: Callable[[], Any]) -> None:
        self._gen_fn: Callable[[], Any] | None = gen_fn
        self._value: Any = None

    @property
    def value(self) -> Any:
        if self._gen_fn is not None:
            self._value, self._gen_fn = self._gen_fn(), None
        return self._value


class TmpFolder:
    """A temporary directory (``name``) removed with the object."""

    def __init__(self) -> None:
        self.name = tempfile.mkdtemp()
        self.cleaner = Cleaner(lambda: shutil.rmtree(self.name))


class _FixedLengthPass:
    """Iteration shared by the fake-data generators: ``len(self)`` items, each from
    ``_produce()``; ``iter()`` gives a copy at the start of a fresh pass."""

    def __init__(self, length: int) -> None:
        self._length = length
        self._produced = 0

    def _produce(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Any:
        fresh = copy.copy(self)
        fresh._produced = 0
        return fresh

    def next(self) -> Any:
        if self._produced >= self._length:
            raise StopIteration
        item = self._produce()  # a failed item is not counted
        self._produced += 1
        return item

    def __next__(self) -> Any:
        return self.next()


class SampleGenerator(_FixedLengthPass):
    """Yields the same ``data`` ``sample_count`` times: fake data in place of a ``DataLoader``.

    ``len()`` is ``sample_count``; every ``iter()`` starts a fresh pass.
    """

    def __init__(self, data: Any, sample_count: int) -> None:
        super().__init__(sample_count)
        self._sample = data

    def _produce(self) -> Any:
        return self._sample


class FnDataGenerator(_FixedLengthPass):
    """Yields ``count`` batches ``(data, func(data))``, ``data = gen_tensor(batch_size, *dims)``."""

    def __init__(
        self,
        func: Callable[[Any], Any],
        batch_size: int,
        gen_tensor: Callable[..., Any],
        dims: Any = None,
        count: int = 1,
    ) -> None:
        super().__init__(count)
        shape = list(dims) if dims else [1]
        self._new_batch = functools.partial(gen_tensor, batch_size, *shape)
        self._target_of = func

    def _produce(self) -> tuple[Any, Any]:
        batch = self._new_batch()
        return batch, self._target_of(batch)


class DataWrapper:
    """Base of user objects whose tensors ``send_cpu_data_to_device`` should move."""

    def get_tensors(self) -> list[Any]:
        """The CPU tensors to send to the device."""
        raise NotImplementedError("The method is missing an implementation")

    def from_tensors(self, tensors: list[Any]) -> Any:
        """The object rebuilt around ``tensors`` (the device copies of ``get_tensors()``)."""
        raise NotImplementedError("The method is missing an implementation")


def as_list(t: Any) -> Any:
    return t if isinstance(t, (tuple, list)) else [t]


def getenv_as(name: str, type: Callable[[str], Any], defval: Any = None) -> Any:  # noqa: A002
    """``type(os.environ[name])``, or ``defval`` when unset; a bool is read as an int."""
    env = os.environ.get(name, None)
    if env is None:
        return defval
    return bool(int(env)) if type is bool else type(env)


def _children(value: Any) -> Iterator[Any]:
    """The values ``for_each_instance`` descends into."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield v
    elif isinstance(value, (list, tuple, set)):
        yield from value
    elif isinstance(value, DataWrapper):
        yield from value.get_tensors()
    elif hasattr(value, "__dict__"):
        yield from list(value.__dict__.values())


def for_each_instance(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]
) -> None:
    """Calls ``fn`` on every object reachable from ``value`` that ``select_fn`` selects (each
    object once), looking into dicts (keys and values), lists, tuples, sets, ``DataWrapper``s
    and object attributes."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if select_fn(item):
            fn(item)
        else:
            stack.extend(reversed(list(_children(item))))


def for_each_instance_rewrite(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]
) -> Any:
    """A copy of ``value`` with each selected object replaced by ``fn(obj)``.

    Shared objects stay shared in the copy; tuples come back as lists (as in torch_xla), other
    objects with a ``__dict__`` as shallow copies with rewritten attributes.
    """
    done: dict[int, Any] = {}

    def rewrite(item: Any) -> Any:
        if id(item) in done:
            return done[id(item)]
        if select_fn(item):
            result = done[id(item)] = fn(item)
        elif isinstance(item, dict):
            result = done[id(item)] = {}
            for k, v in item.items():
                # The key first, as for_each_instance visits them (an assignment would
                # evaluate the value before its subscript).
                key = rewrite(k)
                result[key] = rewrite(v)
        elif isinstance(item, set):
            result = done[id(item)] = set()
            result.update(rewrite(x) for x in item)
        elif isinstance(item, (list, tuple)):
            result = done[id(item)] = []
            result.extend(rewrite(x) for x in item)
        elif isinstance(item, DataWrapper):
            result = done[id(item)] = item.from_tensors([rewrite(x) for x in item.get_tensors()])
        elif hasattr(item, "__dict__"):
            result = done[id(item)] = copy.copy(item)
            for k, v in list(result.__dict__.items()):
                result.__dict__[k] = rewrite(v)
        else:
            result = done[id(item)] = item
        return result

    return rewrite(value)


def shape(inputs: Any) -> list[int]:
    """The nesting shape of equal-length nested lists/tuples (``[]`` for a leaf)."""
    if not isinstance(inputs, (list, tuple)):
        return []
    inner = [shape(x) for x in inputs]
    for s in inner[1:]:
        assert s == inner[0]
    return [len(inputs)] + (inner[0] if inner else [])


def flatten_nested_tuple(inputs: Any) -> tuple[Any, ...]:
    if not isinstance(inputs, (list, tuple)):
        return (inputs,)
    return tuple(leaf for x in inputs for leaf in flatten_nested_tuple(x))


def list_copy_append(ilist: Any, item: Any) -> list[Any]:
    return [*ilist, item]


def null_print(*args: Any, **kwargs: Any) -> None:
    return None


def eprint(*args: Any, **kwargs: Any) -> None:
    print(*args, file=sys.stderr, **kwargs)


def get_print_fn(debug: Any = None) -> Callable[..., None]:
    """``eprint`` when ``debug`` (default: the ``DEBUG`` environment variable) is set."""
    if debug is None:
        debug = int(os.environ.get("DEBUG", "0"))
    return eprint if debug else null_print


def _elapsed_ms(start: float) -> str:
    return f"{1000.0 * (time.time() - start):.3f}ms"


def timed(fn: Callable[[], Any], msg: str = "", printfn: Callable[..., Any] | None = eprint) -> Any:
    printfn = printfn or get_print_fn()
    start = time.time()
    result = fn()
    printfn(msg + _elapsed_ms(start))
    return result


def get_free_tcp_ports(n: int = 1) -> list[int]:
    ports = []
    for _ in range(n):
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            s.bind(("", 0))
            ports.append(s.getsockname()[1])
    return ports


def parallel_work(num_workers: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``fn`` mapped over ``args`` on a thread pool; a worker's exception is raised here."""
    with futures.ThreadPoolExecutor(max_workers=num_workers) as executor:
        return list(executor.map(fn, *args))


class TimedScope:
    """Prints ``msg`` and the elapsed milliseconds when the block ends, unless an error was set."""

    def __init__(self, msg: str = "", printfn: Callable[..., Any] | None = eprint) -> None:
        self._msg = msg
        self._printfn = printfn or get_print_fn()
        self._error: Any = None
        self._start = 0.0

    def __enter__(self) -> TimedScope:
        self._start = time.time()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._error is None:
            self._printfn(self._msg + _elapsed_ms(self._start))

    def set_error(self, error: Any) -> None:
        self._error = error


def check_env_flag(name: str, default: str = "") -> bool:
    return xla_env_flag(name, default)
