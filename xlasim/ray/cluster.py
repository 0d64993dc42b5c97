"""A local Ray cluster whose nodes look like the hosts of a simulated TPU slice.

Each host of the slice becomes one Ray node (``ray.cluster_utils.Cluster``) dressed the
way Ray's own tests fake TPU hosts (``ray/train/v2/tests/test_jax_trainer.py``), so Ray's
TPU code runs unchanged (``SlicePlacementGroup``, head reservation, pod-name sorting):

* resources ``{"TPU": chips_per_host, "accelerator_type:TPU-V4": 1}`` plus
  ``"TPU-{pod_type}-head": 1`` on worker 0 of each multi-host slice;
* labels ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-pod-type``,
  ``ray.io/tpu-topology``;
* env vars ``TPU_NAME``, ``TPU_WORKER_ID``, ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``
  (what GKE sets and Ray reads).

On top, every worker process of the connected job starts with the simulator active
(``xlasim.pth``) as its node's host: the job's ``runtime_env`` (:data:`SIMULATION_RUNTIME_ENV`)
sets ``XLASIM_TOPOLOGY`` / ``XLASIM_ACCELERATOR`` / ``XLASIM_HOST_INDEX`` from the node's
``XLASIM_NODE_*`` values.  ``simulate=False`` leaves them out (a "real" TPU host without
torch_xla, for error-path tests).

The machine behind it may have 2 cores: nodes get 1 logical CPU and a small object store
by default, start-up is bounded, and the cluster is torn down on every exit path.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_backend.topology import SliceSpec, parse_slice
from xlasim.runtime.ports import loopback_address

__all__ = [
    "ClusterStartError",
    "SimulatedTPUCluster",
    "host_node_args",
    "simulated_tpu_cluster",
    "tpu_ray_cluster_fixture",
    "DEFAULT_OBJECT_STORE_BYTES",
    "SIMULATION_RUNTIME_ENV",
    "fit_with_deadline",
    "job_worker_setup",
    "machine_load",
    "release_placement_groups",
    "error_chain_text",
    "HOSTS_PORT_ENV",
    "HOSTS_SLICE_ENV",
    "exchange_address",
    "slice_names",
]

DEFAULT_OBJECT_STORE_BYTES = 80 * 1024 * 1024

SIMULATION_RUNTIME_ENV: dict[str, Any] = {
    "env_vars": {
        "XLASIM_TOPOLOGY": "${XLASIM_NODE_TOPOLOGY}",
        "XLASIM_ACCELERATOR": "${XLASIM_NODE_ACCELERATOR}",
        "XLASIM_HOST_INDEX": "${XLASIM_NODE_HOST_INDEX}",
        "XLASIM_HOSTS_ADDR": "${XLASIM_NODE_HOSTS_ADDR}",
    },
    "worker_process_setup_hook": "xlasim.ray.cluster.job_worker_setup",
}
"""Job runtime_env that activates the simulator in every worker process of the job.

Ray expands ``${VAR}`` from the node's environment when it starts a worker, so each
worker gets its own node's host index.  The activation variables are not set on the
node itself because every Python process started with them imports torch at start-up
(``xlasim.pth``), Ray's per-node agents included, and a raylet whose agent is not up
within Ray's hard-coded 30 s aborts; job workers are the only processes that need it.
On a node without the ``XLASIM_NODE_*`` values (a plain head) they expand to ''.
Every worker of the job also runs :func:`job_worker_setup` first."""
"""Ray's floor is 75 MiB; tests move kilobytes."""

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])

_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"

HOSTS_PORT_ENV = "XLASIM_NODE_HOSTS_PORT"
"""On nodes that know only the port of their slice's host exchange (``xlasim ray-node``: host 0
may be on another machine); :func:`job_worker_setup` finds host 0's address."""

HOSTS_SLICE_ENV = "XLASIM_NODE_HOSTS_SLICE"
"""The slice whose host 0 listens for the exchange, on the nodes of a multislice job (every
slice's hosts exchange in one group, so all meet at the first slice's host 0); unset, a node's
own slice (``TPU_NAME``)."""


def slice_names(base: str, num_slices: int) -> list[str]:
    """The ``TPU_NAME`` of each slice of a job named ``base``: ``base`` itself for one slice,
    else ``base-0``, ``base-1``, ... zero-padded, so that sorting the names (as
    ``tpu_backend`` orders a job's slices) gives the slices in index order."""
    if num_slices == 1:
        return [base]
    width = len(str(num_slices - 1))
    return [f"{base}-{i:0{width}d}" for i in range(num_slices)]


def job_worker_setup() -> None:
    """Runs first in every worker process of a job on a simulated cluster (Ray's
    ``worker_process_setup_hook`` in :data:`SIMULATION_RUNTIME_ENV`).

    Ray Train's ``PlacementGroupCleaner`` asks the state API whether the run's controller
    is alive.  Without ``RAY_ADDRESS`` that API connects to the newest Ray cluster on the
    machine, which on a shared machine may be someone else's (where our controller does
    not exist, so it would remove our placement group); this points it at our own.  And
    with no dashboard here its query always fails, and it warns about that every second:
    those warnings are turned off (:func:`fit_with_deadline` does the cleaning instead).
    On nodes that carry only their slice's exchange port (:data:`HOSTS_PORT_ENV`), it also
    sets ``XLASIM_HOSTS_ADDR`` to host 0's node address and that port.
    """
    import ray  # deferred: Ray is optional; this runs inside Ray workers only

    gcs_address = ray.get_runtime_context().gcs_address
    if gcs_address:
        os.environ.setdefault("RAY_ADDRESS", gcs_address)
    logging.getLogger(_CLEANER_LOGGER).setLevel(logging.ERROR)
    _join_hosts_port()


def _join_hosts_port() -> None:
    """``XLASIM_HOSTS_ADDR`` from the node's port and the address of the host-0 node of its
    exchange's slice (found by its TPU labels), for nodes that carry only the port."""
    import ray  # deferred: Ray is optional; this runs inside Ray workers only

    port = os.environ.get(HOSTS_PORT_ENV)
    slice_name = os.environ.get(HOSTS_SLICE_ENV) or os.environ.get("TPU_NAME")
    if not port or not slice_name or os.environ.get("XLASIM_HOSTS_ADDR"):
        return
    address = exchange_address(ray.nodes(), slice_name, port)
    # No such host 0 in the cluster: left unset, the simulator names the variable if needed.
    if address is not None:
        os.environ["XLASIM_HOSTS_ADDR"] = address


def exchange_address(nodes: list[dict[str, Any]], slice_name: str, port: str) -> str | None:
    """'ip:port' of the live node that is worker 0 of ``slice_name`` among ``nodes`` (as
    ``ray.nodes()`` lists them), or None."""
    for node in nodes:
        labels = node.get("Labels") or {}
        if (
            node.get("Alive")
            and labels.get("ray.io/tpu-slice-name") == slice_name
            and labels.get("ray.io/tpu-worker-id") == "0"
        ):
            return f"{node['NodeManagerAddress']}:{port}"
    return None


def host_node_args(
    spec: SliceSpec,
    host_index: int,
    slice_name: str,
    *,
    simulate: bool = True,
    num_cpus: float = 1,
    extra_env: Mapping[str, str] | None = None,
    hosts_addr: str | None = None,
) -> dict[str, Any]:
    """``Cluster.add_node`` keyword arguments for host ``host_index`` of ``spec``.

    ``hosts_addr`` ('host:port') is where the simulated hosts of this slice meet to
    exchange host-entered data (the simulator's ``XLASIM_HOSTS_ADDR``; host 0 listens).
    """
    resources: dict[str, float] = {
        "TPU": spec.chips_per_host,
        f"accelerator_type:{spec.ray_accelerator_type}": 1,
    }
    if host_index == 0 and spec.is_multi_host:
        # Ray's reserve_tpu_slice gang-schedules a slice through its worker 0's head resource.
        resources[f"TPU-{spec.pod_type}-head"] = 1
    labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(host_index),
        "ray.io/tpu-pod-type": spec.pod_type,
        "ray.io/tpu-topology": spec.topology,
    }
    env = {
        "TPU_NAME": slice_name,
        "TPU_WORKER_ID": str(host_index),
        "TPU_ACCELERATOR_TYPE": spec.pod_type,
        "TPU_TOPOLOGY": spec.topology,
    }
    if simulate:
        # Inert on the node: the job's runtime_env turns them into XLASIM_* for job workers
        # only (see SIMULATION_RUNTIME_ENV).
        env.update(
            {
                "XLASIM_NODE_TOPOLOGY": spec.topology,
                "XLASIM_NODE_ACCELERATOR": spec.accelerator,
                "XLASIM_NODE_HOST_INDEX": str(host_index),
            }
        )
        if hosts_addr is not None:
            env["XLASIM_NODE_HOSTS_ADDR"] = hosts_addr
        # A TPU VM's own environment, not the driver machine's: a PJRT_DEVICE=CPU set where
        # the cluster was started (for a real torch_xla on CPU) would make every simulated
        # worker a CPU client. A job that wants that sets it in its runtime_env.
        env["PJRT_DEVICE"] = ""
    # Workers must import this project (backend functions are pickled by reference) even
    # when it is not installed into the interpreter Ray starts them with.
    pythonpath = [_PROJECT_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pythonpath))
    if extra_env:
        env.update(extra_env)
    return {"num_cpus": num_cpus, "resources": resources, "labels": labels, "env_vars": env}


@dataclass
class SimulatedTPUCluster:
    """A running fake-TPU Ray cluster; the driver is connected to it."""

    spec: SliceSpec
    num_slices: int
    slice_names: list[str]
    address: str
    cluster: Any = field(repr=False)
    startup_s: float = 0.0

    @property
    def num_hosts(self) -> int:
        return self.spec.num_hosts * self.num_slices

    def node_summary(self) -> list[dict[str, Any]]:
        """(labels, resources) of every alive node, as Ray's GCS reports them."""
        import ray  # deferred here and below: Ray is optional (the `ray` extra)

        return [
            {"labels": n.get("Labels", {}), "resources": n.get("Resources", {})}
            for n in ray.nodes()
            if n.get("Alive")
        ]


def _shutdown(cluster: Any) -> None:
    import ray  # deferred: Ray is optional

    with contextlib.suppress(Exception):
        ray.shutdown()
    if cluster is not None:
        with contextlib.suppress(Exception):
            cluster.shutdown()


class ClusterStartError(RuntimeError):
    """The simulated cluster did not come up in any of its start attempts."""


def machine_load() -> str:
    """'load average 7.9 on 2 CPUs': what start-up and timeout messages tell the reader."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not every platform has a load average
        return f"{os.cpu_count()} CPUs"
    return f"load average {load:.1f} on {os.cpu_count()} CPUs"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def simulated_tpu_cluster(
    topology: str = "2x2x2",
    accelerator: str | None = "v4",
    *,
    num_slices: int = 1,
    simulate: bool = True,
    num_cpus_per_host: float = 1,
    head_num_cpus: float = 0,
    separate_head: bool = False,
    include_dashboard: bool = False,
    object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES,
    startup_timeout_s: float = 90.0,
    startup_attempts: int = 2,
    extra_env: Mapping[str, str] | None = None,
    connect: bool = True,
    log_to_driver: bool = True,
    progress: Callable[[str], None] | None = None,
    driver_log_level: int | None = None,
) -> Iterator[SimulatedTPUCluster]:
    """Start a local Ray cluster shaped like ``num_slices`` slices of ``topology``.

    One Ray node per TPU host; the first host is the head node (as in Ray's own
    fake-TPU tests) unless ``separate_head`` adds a TPU-less head, as real TPU clusters
    usually have.  ``head_num_cpus`` extra CPUs go to the head (for test actors).

    Each start attempt is bounded by ``startup_timeout_s``; a failed attempt (Ray's own
    "node timed out during startup" on a loaded machine, or the bound) is torn down and
    retried, ``startup_attempts`` in all, then ``ClusterStartError`` names the bound, the
    attempts, the last cause and the machine's load.  ``progress`` receives one line per
    host that comes up and per retry.  ``driver_log_level`` (e.g. ``logging.WARNING``) is
    the level of this process's ``ray`` logger (Ray's INFO lines: addresses, connecting).
    The cluster is shut down on every exit path.

    No dashboard by default (it needs ``ray[default]`` and a core's worth of start-up).
    Without it Ray Train's ``PlacementGroupCleaner`` cannot ask the state API whether a
    run's controller is gone, so the placement group of a run that failed during worker
    setup is never released; :func:`fit_with_deadline` releases it instead.
    """
    # Deferred: Ray is optional.
    import ray

    if ray.is_initialized():
        raise RuntimeError(
            "simulated_tpu_cluster() needs its own Ray connection, but ray is already "
            "initialized in this process; call ray.shutdown() first"
        )
    spec = parse_slice(topology, accelerator)
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices {num_slices!r} is not valid: expected a positive int")
    if isinstance(startup_attempts, bool) or not isinstance(startup_attempts, int):
        raise ValueError(f"startup_attempts {startup_attempts!r} is not valid: expected an int")
    if startup_attempts < 1:
        raise ValueError(f"startup_attempts {startup_attempts!r} is not valid: expected >= 1")
    names = slice_names(f"xlasim-{spec.pod_type}", num_slices)
    say = progress or (lambda line: None)
    t0 = time.monotonic()
    handle = None
    for attempt in range(1, startup_attempts + 1):
        try:
            handle = _start_cluster(
                spec,
                names,
                simulate=simulate,
                num_cpus_per_host=num_cpus_per_host,
                head_num_cpus=head_num_cpus,
                separate_head=separate_head,
                include_dashboard=include_dashboard,
                object_store_memory=object_store_memory,
                startup_timeout_s=startup_timeout_s,
                extra_env=extra_env,
                connect=connect,
                log_to_driver=log_to_driver,
                driver_log_level=driver_log_level,
                say=say,
            )
            break
        except Exception as exc:
            if attempt == startup_attempts:
                raise ClusterStartError(
                    f"the simulated {spec.pod_type} Ray cluster did not start: "
                    f"{startup_attempts} attempt(s) of at most {startup_timeout_s:g}s each "
                    f"failed (last: {_first_line(exc)}); {machine_load()}"
                ) from exc
            say(
                f"cluster start failed ({_first_line(exc)}; {machine_load()}); "
                f"retrying, attempt {attempt + 1} of {startup_attempts}"
            )
    assert handle is not None
    handle.startup_s = time.monotonic() - t0
    try:
        yield handle
    finally:
        _shutdown(handle.cluster)


def _start_cluster(
    spec: SliceSpec,
    names: list[str],
    *,
    simulate: bool,
    num_cpus_per_host: float,
    head_num_cpus: float,
    separate_head: bool,
    include_dashboard: bool,
    object_store_memory: int,
    startup_timeout_s: float,
    extra_env: Mapping[str, str] | None,
    connect: bool,
    log_to_driver: bool,
    driver_log_level: int | None,
    say: Callable[[str], None],
) -> SimulatedTPUCluster:
    """One bounded start attempt; on any failure the half-started cluster is shut down."""
    # Deferred: Ray is optional.
    import ray
    from ray.cluster_utils import Cluster

    t0 = time.monotonic()
    cluster = None
    if driver_log_level is not None:
        # Before the head starts: it logs the address it writes at INFO.
        logging.getLogger("ray").setLevel(driver_log_level)
    try:
        cluster = Cluster(initialize_head=False, shutdown_at_exit=True)
        hosts = [(name, host) for name in names for host in range(spec.num_hosts)]
        # One rendezvous address per slice for the simulator's cross-host exchange; the
        # host-0 worker of each run listens there, runs on a cluster follow one another.
        # Several slices share one: a multislice job's hosts all exchange in one group.
        shared_addr = loopback_address() if len(names) > 1 else None
        hosts_addrs = {name: shared_addr or loopback_address() for name in names}
        if separate_head:
            cluster.add_node(
                num_cpus=head_num_cpus,
                resources={},
                object_store_memory=object_store_memory,
                include_dashboard=include_dashboard,
            )
        for i, (name, host) in enumerate(hosts):
            args = host_node_args(
                spec,
                host,
                name,
                simulate=simulate,
                num_cpus=num_cpus_per_host,
                extra_env=extra_env,
                hosts_addr=hosts_addrs[name] if spec.is_multi_host or shared_addr else None,
            )
            if cluster.head_node is None:
                # As in Ray's own fake-TPU tests, worker 0 of the first slice is the head.
                args["num_cpus"] += head_num_cpus
                args["include_dashboard"] = include_dashboard
            # One node at a time: each raylet waits at most 30 s (hard-coded in Ray) to
            # register, and starting several at once on a 2-core machine can exceed it.
            cluster.add_node(object_store_memory=object_store_memory, **args)
            where = f" of {name}" if len(names) > 1 else ""
            say(f"host {host + 1}/{spec.num_hosts}{where} up ({time.monotonic() - t0:.1f}s)")
            if time.monotonic() - t0 > startup_timeout_s and i < len(hosts) - 1:
                raise TimeoutError(
                    f"simulated TPU cluster: only {i + 1} of {len(hosts)} hosts started "
                    f"within {startup_timeout_s:g}s"
                )
        remaining = startup_timeout_s - (time.monotonic() - t0)
        cluster.wait_for_nodes(timeout=max(remaining, 1.0))
        if connect:
            init_args: dict[str, Any] = {}
            if driver_log_level is not None:
                init_args["logging_level"] = driver_log_level  # ray.init resets it otherwise
            ray.init(
                address=cluster.address,
                log_to_driver=log_to_driver,
                # A copy: Ray writes the setup hook into the dict it is given.
                runtime_env=copy.deepcopy(SIMULATION_RUNTIME_ENV) if simulate else None,
                **init_args,
            )
        return SimulatedTPUCluster(
            spec=spec,
            num_slices=len(names),
            slice_names=names,
            address=cluster.address,
            cluster=cluster,
        )
    except BaseException:
        _shutdown(cluster)
        raise


def tpu_ray_cluster_fixture(request: Any) -> Iterator[SimulatedTPUCluster]:
    """Body of the ``tpu_ray_cluster`` pytest fixture.

    The slice comes from (first match): indirect parametrization (``"4x4"`` or
    ``("2x2x2", "v4")`` or a dict of :func:`simulated_tpu_cluster` arguments), the
    ``topology`` marker (``@pytest.mark.topology("2x2x2", accelerator="v4")``), else a
    v4-16 (``2x2x2``).  Register it in a plugin or conftest with a thin wrapper that
    imports this module lazily (it imports ray)::

        @pytest.fixture
        def tpu_ray_cluster(request):
            from xlasim.ray.cluster import tpu_ray_cluster_fixture
            yield from tpu_ray_cluster_fixture(request)
    """
    kwargs: dict[str, Any] = {}
    param = getattr(request, "param", None)
    if isinstance(param, str):
        kwargs = {"topology": param, "accelerator": None}
    elif isinstance(param, tuple):
        kwargs = {"topology": param[0], "accelerator": param[1] if len(param) > 1 else None}
    elif isinstance(param, Mapping):
        kwargs = dict(param)
    else:
        marker = request.node.get_closest_marker("topology")
        if marker is not None and marker.args:
            kwargs = {"topology": marker.args[0], "accelerator": marker.kwargs.get("accelerator")}
            if len(marker.args) > 1:
                kwargs["accelerator"] = marker.args[1]
    with simulated_tpu_cluster(**kwargs) as handle:
        yield handle


def release_placement_groups() -> int:
    """Remove every placement group still held on the connected cluster; returns how many.

    Stands in for Ray Train's ``PlacementGroupCleaner``, which needs the dashboard's state
    API: call it only between runs (it frees the TPUs a failed run still holds).
    """
    # Deferred: Ray is optional.
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = 0
    for pg_id, info in (ray.util.placement_group_table() or {}).items():
        if info.get("state") in ("CREATED", "PENDING", "RESCHEDULING"):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
            removed += 1
    return removed


def fit_with_deadline(
    trainer: Any,
    timeout_s: float,
    *,
    release_after: bool = True,
    poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.5,
) -> Any:
    """``trainer.fit()`` bounded in wall time: Ray waits for missing resources forever.

    Raises ``TimeoutError`` after ``timeout_s``.  ``poll`` (e.g. a progress display) is
    called every ``poll_interval_s`` while the run goes on.  With ``release_after`` (for
    clusters that run one training at a time, like :func:`simulated_tpu_cluster`'s),
    placement groups left behind by the run are released when it ends, however it ends.
    """
    import ray  # deferred: Ray is optional

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fit")
    future = pool.submit(trainer.fit)
    deadline = time.monotonic() + timeout_s
    try:
        while poll is not None and not future.done() and time.monotonic() < deadline:
            concurrent.futures.wait([future], timeout=poll_interval_s)
            poll()
        return future.result(timeout=max(deadline - time.monotonic(), 0.0))
    except concurrent.futures.TimeoutError:
        if future.done():
            raise  # fit() itself raised it (the same class since Python 3.11)
        raise TimeoutError(f"TorchTrainer.fit() did not finish within {timeout_s:g}s") from None
    finally:
        pool.shutdown(wait=False)
        if release_after and ray.is_initialized() and future.done():
            with contextlib.suppress(Exception):
                release_placement_groups()


def error_chain_text(exc: BaseException) -> str:
    """Messages of ``exc`` and of every exception it wraps (Ray nests the worker's error
    inside its own), one per line, for asserting on the root cause."""
    parts: list[str] = []
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}")
        stack.extend([e.__cause__, e.__context__, getattr(e, "cause", None)])
        stack.extend(getattr(e, "exceptions", None) or [])
        for attr in ("worker_failures", "errors"):
            errs = getattr(e, attr, None)
            if isinstance(errs, dict):
                stack.extend(errs.values())
    return "\n".join(parts)
