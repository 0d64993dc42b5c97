"""Ray nodes on this machine dressed as some hosts of a simulated TPU slice, joining any Ray
cluster: ``xlasim ray-node --topology 8x8 --accelerator v6e --hosts 4-7 --address HEAD:PORT``.

Each simulated host is its own Ray node (a ``ray start --block`` process and its raylet), with
the resources, labels and environment :func:`xlasim.ray.cluster.host_node_args` gives the
hosts of :func:`xlasim.ray.cluster.simulated_tpu_cluster`, so Ray's TPU placement and the
``tpu_backend`` bootstrap see the same slice whichever machines its hosts are spread over.
:func:`kuberay_worker_groups` writes the same nodes as KubeRay worker groups.

What differs from the one-machine cluster is where the simulated hosts meet to exchange
host-entered data (``XLASIM_HOSTS_ADDR``: host 0 listens).  Host 0 may be on any machine, so
every node of a slice carries only the port (:data:`HOSTS_PORT_ENV`); when a job's worker
starts, :func:`xlasim.ray.cluster.job_worker_setup` finds host 0's node by its labels and
joins the port to that node's address.  A multislice job (``--num-slices 2 --slice-index 1``
on the machines of its second slice) exchanges in one group across its slices, as their hosts
do over DCN: every node also names the first slice (:data:`HOSTS_SLICE_ENV`), whose host 0
listens, and the slices are named ``NAME-0``, ``NAME-1``, ... in the order ``tpu_backend``
numbers them.

The driver activates the simulator in the job's workers with the job's ``runtime_env``:
``ray.init(address=..., runtime_env=SIMULATION_RUNTIME_ENV)``, or, for a driver that must stay
unchanged, ``RAY_RUNTIME_ENV_HOOK=xlasim.ray.node.with_simulation``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpu_backend.topology import (
    DEFAULT_ACCELERATOR,
    SliceSpec,
    check_slice_index,
    parse_slice,
)
from xlasim.arguments import (
    OneLineErrorParser,
    fail,
    positive_float,
    positive_int,
    reject_dash_topologies,
)
from xlasim.ray.cluster import (
    DEFAULT_OBJECT_STORE_BYTES,
    HOSTS_PORT_ENV,
    HOSTS_SLICE_ENV,
    SIMULATION_RUNTIME_ENV,
    host_node_args,
    machine_load,
    slice_names,
)

__all__ = [
    "HOSTS_PORT_ENV",
    "KUBERAY_VERSION",
    "NodePlan",
    "NodeProcess",
    "RESERVED_RAY_START_OPTIONS",
    "default_hosts_port",
    "default_slice_name",
    "head_command",
    "kuberay_worker_groups",
    "node_plans",
    "main",
    "parse_hosts",
    "running_nodes",
    "start_node",
    "stop_nodes",
    "with_simulation",
]

KUBERAY_VERSION = "v1.5"
"""The KubeRay release whose ``RayCluster`` (``ray.io/v1``) worker-group shape
:func:`kuberay_worker_groups` follows: ``rayStartParams`` values are strings, custom resources a
quoted JSON string, node labels ``key=value`` pairs."""

RESERVED_RAY_START_OPTIONS = (
    "--address",
    "--head",
    "--block",
    "--resources",
    "--labels",
    "--labels-file",
)
"""``ray start`` options the hosts' nodes set themselves: passing one is an error."""

_HOSTS_PORT_RANGE = (20000, 30000)
_STARTED_LINE = "Ray runtime started"


def default_slice_name(spec: SliceSpec) -> str:
    return f"xlasim-{spec.pod_type}"


def default_hosts_port(slice_name: str) -> int:
    """The port host 0 listens on for the slice's data exchange, derived from the slice name
    so that nodes started separately (other machines, KubeRay pods) agree without being told."""
    low, high = _HOSTS_PORT_RANGE
    return low + zlib.crc32(slice_name.encode()) % (high - low)


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_hosts(text: str, spec: SliceSpec) -> list[int]:
    """'4-7', '0,2', '0-1,5' -> host indexes of ``spec``, ascending; ``ValueError`` names the
    bad part and the valid range."""
    valid = f"hosts of {spec.pod_type} are 0-{spec.num_hosts - 1}"
    hosts: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(
                f"--hosts {text!r} is not valid: expected host indexes and ranges like "
                f"'4-7' or '0,2,5-6' ({valid})"
            )
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"--hosts range {part.strip()!r} is empty: write it low-high")
        if last >= spec.num_hosts:
            raise ValueError(f"--hosts {text!r}: host {last} is not in the slice ({valid})")
        for h in range(first, last + 1):
            if h in hosts:
                raise ValueError(f"--hosts {text!r} names host {h} twice")
            hosts.append(h)
    return sorted(hosts)


@dataclass(frozen=True)
class NodePlan:
    """One simulated host's Ray node: what it advertises and the ``ray start`` that starts it."""

    host_index: int
    resources: dict[str, float]
    labels: dict[str, str]
    env: dict[str, str]
    num_cpus: float
    argv: list[str] = field(default_factory=list)


def node_plans(
    spec: SliceSpec,
    hosts: Sequence[int],
    *,
    address: str,
    slice_name: str,
    hosts_port: int,
    hosts_slice: str | None = None,
    num_cpus: float = 1,
    object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES,
    ray_start_args: Sequence[str] = (),
) -> list[NodePlan]:
    """The ``ray start`` of every host in ``hosts``; the node rules are ``host_node_args``'s.

    ``hosts_slice`` names the slice whose host 0 listens on ``hosts_port`` when that is not
    ``slice_name`` itself (the first slice of a multislice job)."""
    exchange = {HOSTS_PORT_ENV: str(hosts_port)}
    if hosts_slice is not None and hosts_slice != slice_name:
        exchange[HOSTS_SLICE_ENV] = hosts_slice
    plans = []
    for i, h in enumerate(hosts):
        args = host_node_args(spec, h, slice_name, num_cpus=num_cpus, extra_env=exchange)
        argv = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            f"--address={address}",
            f"--num-cpus={args['num_cpus']:g}",
            f"--resources={json.dumps(args['resources'])}",
            f"--labels={_labels_text(args['labels'])}",
            f"--object-store-memory={object_store_memory}",
            "--block",
            # Ray: one log monitor per machine (each watches the whole session's log files).
            *(["--include-log-monitor=false"] if i else []),
            *ray_start_args,
        ]
        plans.append(
            NodePlan(
                host_index=h,
                resources=args["resources"],
                labels=args["labels"],
                env=args["env_vars"],
                num_cpus=args["num_cpus"],
                argv=argv,
            )
        )
    return plans


def head_command(port: int, temp_dir: str | os.PathLike[str], *, num_cpus: float = 0) -> list[str]:
    """``ray start --head`` of a small cluster to try this on (no dashboard, small object store,
    no TPU: a real TPU cluster's head usually has none either)."""
    return [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus:g}",
        "--include-dashboard=false",
        f"--object-store-memory={DEFAULT_OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        "--block",
    ]


def _labels_text(labels: Mapping[str, str]) -> str:
    # `ray start --labels` takes 'k=v,k=v' (its JSON form rejects Ray's own `ray.io/` keys).
    return ",".join(f"{k}={v}" for k, v in labels.items())


def kuberay_worker_groups(
    plans: Sequence[NodePlan], *, slice_name: str, image: str = "YOUR_IMAGE"
) -> str:
    """The nodes of ``plans`` as KubeRay ``workerGroupSpecs`` (YAML), one group of one pod per
    host: the hosts differ in their worker id, so they cannot share a pod template.

    ``image`` must have this project installed (``pip install xlasim[ray]``): the workers
    import it, and the pods get no ``PYTHONPATH`` pointing at a checkout.
    """
    groups = []
    for plan in plans:
        env = [{"name": k, "value": v} for k, v in plan.env.items() if k != "PYTHONPATH"]
        groups.append(
            {
                "groupName": f"{slice_name}-host{plan.host_index}",
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": 1,
                "rayStartParams": {
                    "num-cpus": f"{plan.num_cpus:g}",
                    # KubeRay passes the value to `ray start` through a shell: quoted JSON.
                    "resources": '"' + json.dumps(plan.resources).replace('"', '\\"') + '"',
                    "labels": _labels_text(plan.labels),
                },
                "template": {
                    "spec": {
                        "containers": [{"name": "ray-worker", "image": image, "env": env}],
                    }
                },
            }
        )
    header = (
        f"# KubeRay {KUBERAY_VERSION} (RayCluster ray.io/v1): add these groups to "
        f"spec.workerGroupSpecs; every pod needs the\n# port {plans[0].env[HOSTS_PORT_ENV]} "
        f"open to the other pods of the job (simulated host 0 of its first slice listens "
        f"on it).\n"
    )
    return header + yaml.safe_dump({"workerGroupSpecs": groups}, sort_keys=False)


def with_simulation(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """``runtime_env`` plus what activates the simulator in the job's workers.

    Ray calls it on ``ray.init`` when ``RAY_RUNTIME_ENV_HOOK=xlasim.ray.node.with_simulation``
    is set, so a driver connects to a cluster of simulated hosts without changing its code.
    """
    env = dict(runtime_env or {})
    hook = SIMULATION_RUNTIME_ENV["worker_process_setup_hook"]
    theirs = env.get("worker_process_setup_hook")
    if theirs not in (None, hook):
        raise ValueError(
            f"runtime_env already has worker_process_setup_hook={theirs!r}; the simulated "
            f"hosts need {hook!r} (call yours from a hook that calls both)"
        )
    env["worker_process_setup_hook"] = hook
    env["env_vars"] = {**SIMULATION_RUNTIME_ENV["env_vars"], **env.get("env_vars", {})}
    return env


# -- node processes ------------------------------------------------------------------------------


@dataclass
class NodeProcess:
    """A ``ray start --block`` process (its own process group) and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def started(self) -> bool:
        try:
            return _STARTED_LINE in self.log_path.read_text(errors="replace")
        except OSError:
            return False


def start_node(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    *,
    timeout_s: float,
) -> NodeProcess:
    """Start one Ray node and wait (at most ``timeout_s``) until it has joined its cluster.

    ``ray start`` prints that it started once its raylet is registered, then blocks.  On a
    failure or the bound the node is stopped and ``RuntimeError``/``TimeoutError`` carries its
    last output lines.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it stops its raylet too
        )
    node = NodeProcess(name, proc, log_path)
    deadline = time.monotonic() + timeout_s
    try:
        while not node.started():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name}: `ray start` exited with status {proc.returncode} before its node "
                    f"joined the cluster; its last lines:\n{node.output_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{name}: the Ray node did not join the cluster within {timeout_s:g}s "
                    f"({machine_load()}); its last lines:\n{node.output_tail()}"
                )
            time.sleep(0.2)
    except BaseException:
        stop_nodes([node], grace_s=0)
        raise
    return node


def stop_nodes(nodes: Sequence[NodeProcess], *, grace_s: float = 10.0) -> None:
    """SIGTERM every node's process group (Ray drains the node), SIGKILL what is left after
    ``grace_s``; returns when every ``ray start`` process has exited."""
    for node in nodes:
        _signal_group(node, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        # Also after a clean exit: the raylet and its workers may outlive `ray start`.
        _signal_group(node, signal.SIGKILL)
        node.process.wait()


def _signal_group(node: NodeProcess, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(node.pid, sig)


_START_ATTEMPTS = 2


def _start_with_retry(
    plan: NodePlan,
    env: Mapping[str, str],
    log_dir: Path,
    deadline: float,
    say: Callable[[str], None],
) -> NodeProcess:
    """A node whose `ray start` gave up (Ray's fixed start-up timeout, which a loaded machine
    can miss) is started once more, within the same overall deadline."""
    attempt = 1
    while True:
        try:
            return start_node(
                f"host {plan.host_index}",
                plan.argv,
                env,
                log_dir / f"host{plan.host_index}-{attempt}.log",
                timeout_s=max(deadline - time.monotonic(), 0.0),
            )
        except RuntimeError as exc:
            if attempt == _START_ATTEMPTS or time.monotonic() >= deadline:
                raise
            last = exc.args[0].splitlines()[-1] if exc.args else ""
            say(f"host {plan.host_index}: `ray start` failed ({last}; {machine_load()}); retrying")
            attempt += 1


@contextlib.contextmanager
def running_nodes(
    plans: Sequence[NodePlan],
    log_dir: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    say: Callable[[str], None] = lambda line: None,
) -> Iterator[list[NodeProcess]]:
    """Start the nodes of ``plans`` one at a time (each raylet must register within Ray's fixed
    30 s, which several at once on a small machine can miss); all are stopped on exit."""
    nodes: list[NodeProcess] = []
    t0 = time.monotonic()
    try:
        for plan in plans:
            env = {**(base_env if base_env is not None else os.environ), **plan.env}
            remaining = timeout_s - (time.monotonic() - t0)
            if remaining <= 0:
                raise TimeoutError(
                    f"only {len(nodes)} of {len(plans)} hosts' Ray nodes started within "
                    f"{timeout_s:g}s ({machine_load()})"
                )
            node = _start_with_retry(plan, env, log_dir, t0 + timeout_s, say)
            nodes.append(node)
            say(f"host {plan.host_index} joined (pid {node.pid}, {time.monotonic() - t0:.1f}s)")
        yield nodes
    finally:
        stop_nodes(nodes)


# -- the command ---------------------------------------------------------------------------------

_PROG = "xlasim ray-node"


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 2**16):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a port in 1..65535")
    return int(text)


def _cpus(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a number of CPUs >= 0")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog=_PROG,
        allow_abbrev=False,  # '--num-cpus' is ray start's, not a short '--num-cpus-per-host'
        description=(
            "Start Ray nodes on this machine that are some hosts of a simulated TPU slice and "
            "join an existing Ray cluster; options this command does not know go to every "
            "`ray start`."
        ),
    )
    parser.add_argument("--topology", required=True, help="chip grid of the slice, e.g. 8x8")
    parser.add_argument(
        "--accelerator", default=None, help=f"TPU generation (default {DEFAULT_ACCELERATOR})"
    )
    parser.add_argument(
        "--hosts", default=None, help="host indexes on this machine, e.g. 4-7 or 0,2 (default all)"
    )
    parser.add_argument("--address", default=None, help="the Ray cluster to join (HEAD_IP:PORT)")
    parser.add_argument(
        "--slice-name",
        default=None,
        help="the slice's TPU_NAME, the same on every machine of the slice and different per "
        "slice (default xlasim-POD_TYPE); with --num-slices, the job's name: slice I is NAME-I",
    )
    parser.add_argument(
        "--num-slices",
        type=positive_int,
        default=1,
        help="slices of the topology in the multislice job these hosts belong to (default 1)",
    )
    parser.add_argument(
        "--slice-index",
        type=int,
        default=None,
        help="the slice of the job these hosts are in (required with --num-slices above 1)",
    )
    parser.add_argument(
        "--hosts-port",
        type=_port,
        default=None,
        help="port simulated host 0 (of the first slice) listens on for the hosts' data "
        "exchange, the same on every machine of the job (default: derived from its name)",
    )
    parser.add_argument(
        "--num-cpus-per-host",
        type=_cpus,
        default=1.0,
        help="logical CPUs each host's node advertises to Ray (default 1)",
    )
    parser.add_argument(
        "--kuberay",
        action="store_true",
        help="print the hosts as KubeRay worker groups (YAML) and start nothing",
    )
    parser.add_argument("--image", default="YOUR_IMAGE", help="container image for --kuberay")
    parser.add_argument("--log-dir", default=None, help="where each node's `ray start` output goes")
    parser.add_argument(
        "--startup-timeout-s",
        type=positive_float,
        default=180.0,
        help="bound on all the nodes joining the cluster (default 180)",
    )
    return parser


def _check_ray_start_args(args: Sequence[str]) -> None:
    """Every extra argument must be a `ray start` option this command does not set itself."""
    # Deferred: the check needs Ray's CLI definition (the optional `ray` extra).
    from ray.scripts.scripts import start

    known = {opt for p in start.params for opt in (*p.opts, *p.secondary_opts)}
    for arg in args:
        if not arg.startswith("-"):
            fail(_PROG, f"unexpected argument {arg!r}: ray start options start with '--'")
        name = arg.split("=", 1)[0]
        if name in RESERVED_RAY_START_OPTIONS:
            fail(_PROG, f"{name} is set by {_PROG} itself (see its --help); leave it out")
        if name not in known:
            fail(_PROG, f"{name} is neither an option of {_PROG} nor of `ray start`")


_REACH_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """One TCP connection to the head's GCS port: a typo fails here, not after `ray start`
    has retried for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        fail(_PROG, f"--address {address!r} is not valid: expected HEAD_IP:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        fail(
            _PROG,
            f"cannot reach the Ray cluster at --address {address} (tried for at most "
            f"{_REACH_TIMEOUT_S:g}s): {exc}",
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    reject_dash_topologies(parser, argv)
    args, ray_args = parser.parse_known_args(argv)
    try:
        spec = parse_slice(args.topology, args.accelerator)
        hosts = parse_hosts(args.hosts, spec) if args.hosts else list(range(spec.num_hosts))
    except ValueError as exc:
        fail(_PROG, str(exc))
    slice_index = _slice_index(args.num_slices, args.slice_index)
    if not args.kuberay and not args.address:
        fail(_PROG, "--address HEAD_IP:PORT of the Ray cluster to join is required")
    _check_ray_start_args(ray_args)
    if not args.kuberay:
        _check_reachable(args.address)
    names = slice_names(args.slice_name or default_slice_name(spec), args.num_slices)
    slice_name = names[slice_index]
    # Every slice's hosts exchange in one group, at the first slice's host 0.
    port = args.hosts_port or default_hosts_port(names[0])
    plans = node_plans(
        spec,
        hosts,
        address=args.address or "",
        slice_name=slice_name,
        hosts_port=port,
        hosts_slice=names[0],
        num_cpus=args.num_cpus_per_host,
        ray_start_args=ray_args,
    )
    if args.kuberay:
        sys.stdout.write(kuberay_worker_groups(plans, slice_name=slice_name, image=args.image))
        return 0
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="xlasim-ray-node-"))
    where = slice_name if args.num_slices == 1 else f"{slice_name}, {slice_index} of {len(names)}"
    return _serve(plans, spec, where, args.address, log_dir, args.startup_timeout_s)


def _slice_index(num_slices: int, slice_index: int | None) -> int:
    """This machine's slice of the job: the one ``--slice-index`` names (any machine hosts
    hosts of one slice), 0 for a one-slice job."""
    if slice_index is None:
        if num_slices > 1:
            fail(
                _PROG,
                f"--slice-index is required with --num-slices {num_slices}: the slice (0-"
                f"{num_slices - 1}) whose hosts this machine starts",
            )
        return 0
    try:
        return check_slice_index(slice_index, num_slices)
    except ValueError as exc:
        fail(_PROG, f"--slice-index: {exc}")


def _serve(
    plans: Sequence[NodePlan],
    spec: SliceSpec,
    slice_name: str,
    address: str,
    log_dir: Path,
    timeout_s: float,
) -> int:
    """Start the nodes, then keep them until Ctrl-C / SIGTERM or until one of them exits."""

    def say(line: str) -> None:
        print(f"{_PROG}: {line}", flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    names = ",".join(str(p.host_index) for p in plans)
    try:
        with running_nodes(plans, log_dir, timeout_s=timeout_s, say=say) as nodes:
            say(
                f"hosts {names} of {spec.pod_type} (slice {slice_name}) are Ray nodes of "
                f"{address}; their output is in {log_dir}; Ctrl-C stops them"
            )
            while True:
                for node in nodes:
                    if node.process.poll() is not None:
                        say(
                            f"{node.name}'s Ray node exited with status "
                            f"{node.process.returncode}; stopping the others. Its last lines:\n"
                            f"{node.output_tail()}"
                        )
                        return 1
                time.sleep(0.5)
    except KeyboardInterrupt:
        say(f"stopping hosts {names}")
        return 0
    except (RuntimeError, TimeoutError) as exc:
        say(str(exc))
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
