"""Simulated TPU hosts as nodes of a real multi-node Ray cluster (``xlasim ray-node``).

The live tests start what a team's cluster is: a head (``ray start --head``) and two
``xlasim ray-node`` commands, each its own ``ray start`` worker node on its own ports, as on
two machines, hosting host 0 and host 1 of one v4-16 slice.  An unchanged driver (only
``RAY_ADDRESS`` and ``RAY_RUNTIME_ENV_HOOK`` in its environment) trains on it with
``tpu_backend.TorchTrainer``; then one node's ``ray start`` is killed during a run.  A cluster
of its own has the one host of each slice of a 2 x v4-8 job on two machines
(``--num-slices 2 --slice-index S``), which train as one slice of the same global batch.  Every wait
is bounded (the bounds are named below) and every process started here is stopped on every
exit path, by its process group, never with ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch_tpu_ddp
from global_batch import check_two_slice_records
from sockets import free_port

pytest.importorskip("ray.train")

import yaml  # noqa: E402  (Ray's own dependency)
from shared_clusters import RAY_TEST_ENV  # noqa: E402

from tpu_backend.topology import parse_slice  # noqa: E402
from xlasim.cli.commands import main as xlasim_main  # noqa: E402
from xlasim.ray import node as ray_node  # noqa: E402
from xlasim.ray.cluster import (  # noqa: E402
    SIMULATION_RUNTIME_ENV,
    exchange_address,
    slice_names,
)

ROOT = Path(__file__).resolve().parents[1]

# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]

NODE_START_BOUND_S = 180.0  # one node joining, on a loaded 2-core machine
FIT_BOUND_S = 400.0  # one training run, or its failure being noticed
DRIVER_BOUND_S = FIT_BOUND_S + 120.0  # the driver process: imports, connect, fit, checks
STOP_BOUND_S = 60.0  # an `xlasim ray-node` stopping its nodes


# -- hosts, node plans, the KubeRay snippet: nothing starts --------------------------------------


def test_hosts_are_ranges_and_indexes_of_the_slice():
    spec = parse_slice("8x8", "v6e")  # 16 hosts of 4 chips
    assert ray_node.parse_hosts("4-7", spec) == [4, 5, 6, 7]
    assert ray_node.parse_hosts("9,0-1", spec) == [0, 1, 9]
    assert ray_node.parse_hosts("15", spec) == [15]


@pytest.mark.parametrize(
    "hosts, message",
    [
        ("4-16", "host 16 is not in the slice (hosts of v6e-64 are 0-15)"),
        ("4-6,5", "names host 5 twice"),
        ("6-4", "range '6-4' is empty"),
        ("a-b", "'a-b' is not valid"),
        ("", "'' is not valid"),
    ],
)
def test_bad_hosts_are_named(hosts, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ray_node.parse_hosts(hosts, parse_slice("8x8", "v6e"))


def _plans(hosts, **kw):
    spec = parse_slice("8x8", "v6e")
    kw.setdefault("address", "10.0.0.1:6380")
    kw.setdefault("slice_name", "big")
    kw.setdefault("hosts_port", 29123)
    return ray_node.node_plans(spec, hosts, **kw)


def _option(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def test_each_host_is_a_ray_start_with_its_tpu_host_resources_labels_and_env():
    plans = _plans([0, 5], ray_start_args=["--temp-dir=/tmp/x"])
    for plan, host in zip(plans, [0, 5], strict=True):
        argv = plan.argv
        assert argv[1:4] == ["-m", "ray.scripts.scripts", "start"]
        assert _option(argv, "--address") == "10.0.0.1:6380"
        assert "--block" in argv and argv[-1] == "--temp-dir=/tmp/x"
        # one log monitor per machine, as Ray asks: the first node's
        assert ("--include-log-monitor=false" in argv) == (plan is not plans[0])
        resources = json.loads(_option(argv, "--resources"))
        assert resources["TPU"] == 4 and resources["accelerator_type:TPU-V6E"] == 1
        # only worker 0 carries the head resource Ray's slice reservation looks for
        assert ("TPU-v6e-64-head" in resources) == (host == 0)
        labels = dict(kv.split("=") for kv in _option(argv, "--labels").split(","))
        assert labels == {
            "ray.io/tpu-slice-name": "big",
            "ray.io/tpu-worker-id": str(host),
            "ray.io/tpu-pod-type": "v6e-64",
            "ray.io/tpu-topology": "8x8",
        }
        assert (plan.env["TPU_NAME"], plan.env["TPU_WORKER_ID"]) == ("big", str(host))
        assert plan.env["XLASIM_NODE_HOST_INDEX"] == str(host)
        assert plan.env["XLASIM_NODE_HOSTS_PORT"] == "29123"
        # the activation variables stay off the node (its agents would import torch)
        assert "XLASIM_TOPOLOGY" not in plan.env


def test_the_default_exchange_port_is_the_same_for_a_slice_on_every_machine():
    a = ray_node.default_hosts_port("xlasim-v6e-64")
    assert a == ray_node.default_hosts_port("xlasim-v6e-64")
    assert 20000 <= a < 30000
    assert a != ray_node.default_hosts_port("xlasim-v6e-64-b")


def test_kuberay_snippet_is_one_worker_group_per_host():
    text = ray_node.kuberay_worker_groups(_plans([4, 5, 6, 7]), slice_name="big", image="img:1")
    assert "KubeRay v1.5" in text.splitlines()[0]
    groups = yaml.safe_load(text)["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == [f"big-host{h}" for h in (4, 5, 6, 7)]
    for host, group in zip((4, 5, 6, 7), groups, strict=True):
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 1)
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values())  # KubeRay wants strings
        assert params["num-cpus"] == "1"
        # KubeRay hands the value to `ray start` through a shell: a quoted JSON string
        quoted = params["resources"]
        assert quoted[0] == quoted[-1] == '"'
        assert json.loads(quoted[1:-1].replace('\\"', '"')) == {
            "TPU": 4,
            "accelerator_type:TPU-V6E": 1,
        }
        labels = dict(kv.split("=") for kv in params["labels"].split(","))
        assert labels["ray.io/tpu-worker-id"] == str(host)
        assert labels["ray.io/tpu-slice-name"] == "big"
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] == "img:1"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TPU_WORKER_ID"] == str(host) and env["TPU_NAME"] == "big"
        assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"]) == ("v6e-64", "8x8")
        assert env["XLASIM_NODE_HOST_INDEX"] == str(host)
        assert env["XLASIM_NODE_HOSTS_PORT"] == "29123"
        assert "PYTHONPATH" not in env  # a pod's image has the package installed


def test_kuberay_command_prints_the_snippet_without_a_cluster(capsys):
    argv = ["ray-node", "--topology", "2x2x2", "--accelerator", "v4", "--kuberay"]
    assert xlasim_main(argv) == 0
    groups = yaml.safe_load(capsys.readouterr().out)["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["xlasim-v4-16-host0", "xlasim-v4-16-host1"]
    assert "TPU-v4-16-head" in groups[0]["rayStartParams"]["resources"]
    assert "TPU-v4-16-head" not in groups[1]["rayStartParams"]["resources"]


def _kuberay_env(capsys, *args):
    argv = ["ray-node", "--topology", "2x2x1", "--accelerator", "v4", "--kuberay", *args]
    assert xlasim_main(argv) == 0
    (group,) = yaml.safe_load(capsys.readouterr().out)["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_each_slice_of_a_multislice_job_meets_at_the_first_slices_host_0(capsys):
    first = _kuberay_env(capsys, "--num-slices", "2", "--slice-index", "0")
    second = _kuberay_env(capsys, "--num-slices", "2", "--slice-index", "1")
    assert (first["TPU_NAME"], second["TPU_NAME"]) == ("xlasim-v4-8-0", "xlasim-v4-8-1")
    # one exchange for the job: the same port on every slice, the first slice's host 0 listens
    port = str(ray_node.default_hosts_port("xlasim-v4-8-0"))
    assert first["XLASIM_NODE_HOSTS_PORT"] == second["XLASIM_NODE_HOSTS_PORT"] == port
    assert "XLASIM_NODE_HOSTS_SLICE" not in first
    assert second["XLASIM_NODE_HOSTS_SLICE"] == "xlasim-v4-8-0"
    named = _kuberay_env(capsys, "--num-slices", "2", "--slice-index", "1", "--slice-name", "j")
    assert (named["TPU_NAME"], named["XLASIM_NODE_HOSTS_SLICE"]) == ("j-1", "j-0")
    # one slice: its own name, no exchange slice named
    single = _kuberay_env(capsys)
    assert single["TPU_NAME"] == "xlasim-v4-8" and "XLASIM_NODE_HOSTS_SLICE" not in single


def test_slice_names_sort_in_slice_order():
    # tpu_backend numbers a job's slices by sorting their names
    names = slice_names("job", 12)
    assert names[:2] == ["job-00", "job-01"] and names[-1] == "job-11"
    assert sorted(names) == names
    assert slice_names("job", 1) == ["job"]


def test_a_worker_finds_the_exchange_at_its_slices_host_0_node():
    def node(name, worker, ip, alive=True):
        labels = {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": worker}
        return {"Alive": alive, "Labels": labels, "NodeManagerAddress": ip}

    nodes = [
        {"Alive": True, "Labels": {}, "NodeManagerAddress": "10.0.0.1"},  # a TPU-less head
        node("j-1", "0", "10.0.0.3"),
        node("j-0", "1", "10.0.0.4"),
        node("j-0", "0", "10.0.0.5", alive=False),  # a dead node is no one's exchange
        node("j-0", "0", "10.0.0.2"),
    ]
    assert exchange_address(nodes, "j-0", "2900") == "10.0.0.2:2900"
    assert exchange_address(nodes, "j-1", "2900") == "10.0.0.3:2900"
    assert exchange_address(nodes, "j-2", "2900") is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--topology", "8x8", "--hosts", "4-16", "--address", "h:1"], "host 16 is not in"),
        (["--topology", "8x8", "--hosts", "4-6,5", "--address", "h:1"], "names host 5 twice"),
        (["--topology", "8x8", "--hosts", "4-7"], "--address HEAD_IP:PORT"),
        (["--topology", "8x8x8", "--address", "h:1"], "topology '8x8x8' is 3-D"),
        (["--topology", "4x4", "--address", "h"], "--address 'h' is not valid"),
        (["--topology", "4x4", "--address", "h:1", "--resources={}"], "--resources is set by"),
        (["--topology", "4x4", "--address", "h:1", "--labels=a=b"], "--labels is set by"),
        (["--topology", "4x4", "--address", "h:1", "--frob"], "--frob is neither an option"),
        (["--topology", "4x4", "--address", "h:1", "stray"], "unexpected argument 'stray'"),
        (["--topology", "4x4", "--address", "h:1", "--hosts-port", "70000"], "port in 1..65535"),
        (["--topology", "4x4", "--address", "h:1", "--num-cpus-per-host", "-1"], "CPUs >= 0"),
        (
            ["--topology", "4x4", "--address", "h:1", "--num-slices", "2"],
            "--slice-index is required with --num-slices 2: the slice (0-1)",
        ),
        (
            ["--topology", "4x4", "--address", "h:1", "--num-slices", "2", "--slice-index", "2"],
            "slice_index 2 is out of range for 2 slice(s): valid slice indices are 0..1",
        ),
        (["--topology", "4x4", "--address", "h:1", "--slice-index", "1"], "for 1 slice(s)"),
        (["--topology", "4x4", "--address", "h:1", "--num-slices", "0"], "'0'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        xlasim_main(["ray-node", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("xlasim ray-node: ") and err.count("\n") == 1, err
    assert message in err


def test_an_unreachable_cluster_is_one_line_and_exit_2(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            xlasim_main(["ray-node", "--topology", "4x4", "--address", f"127.0.0.1:{port}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and f"cannot reach the Ray cluster at --address 127.0.0.1:{port}" in err
    )


def test_runtime_env_hook_adds_the_simulation_to_the_drivers_runtime_env():
    env = ray_node.with_simulation({"env_vars": {"A": "1"}, "pip": ["x"]})
    assert env["pip"] == ["x"]
    assert env["env_vars"] == {"A": "1", **SIMULATION_RUNTIME_ENV["env_vars"]}
    assert env["worker_process_setup_hook"] == "xlasim.ray.cluster.job_worker_setup"
    assert ray_node.with_simulation(None)["env_vars"] == SIMULATION_RUNTIME_ENV["env_vars"]
    with pytest.raises(ValueError, match="worker_process_setup_hook='mine.hook'"):
        ray_node.with_simulation({"worker_process_setup_hook": "mine.hook"})


def test_a_node_that_exits_before_joining_is_retried_once_then_named(tmp_path):
    failing = [sys.executable, "-c", "print('no cluster here'); raise SystemExit(3)"]
    plan = ray_node.NodePlan(2, {}, {}, {}, 1, argv=failing)
    said: list[str] = []
    with (
        pytest.raises(RuntimeError, match=r"host 2: `ray start` exited with status 3") as exc,
        ray_node.running_nodes([plan], tmp_path, timeout_s=120, say=said.append),
    ):
        pass
    assert "no cluster here" in str(exc.value)  # its last lines come with the error
    assert len(said) == 1 and "retrying" in said[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host2-1.log", "host2-2.log"]


def test_a_node_that_never_joins_trips_the_named_bound_and_is_stopped(tmp_path):
    hanging = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(TimeoutError, match=r"did not join the cluster within 1s") as exc:
        ray_node.start_node("host 0", hanging, os.environ, tmp_path / "h.log", timeout_s=1)
    assert "load average" in str(exc.value) or "CPUs" in str(exc.value)


# -- a live cluster: a head and two `xlasim ray-node` machines ---------------------------------


@dataclass
class Machine:
    """One `xlasim ray-node` process, standing for one machine of the cluster."""

    hosts: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def node_pids(self) -> dict[int, int]:
        return {
            int(h): int(p) for h, p in re.findall(r"host (\d+) joined \(pid (\d+)", self.output())
        }


@dataclass
class LiveCluster:
    address: str
    env: dict[str, str]
    machines: list[Machine]
    temp_dir: Path


def _wait_for(predicate, bound_s: float, what: str, detail) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {bound_s:g}s:\n{detail()}")
        time.sleep(0.5)


def _start_machine(
    hosts: str, cluster_env, address, hosts_port, temp_dir, log_dir, slice_args=(), cpus=1
) -> Machine:
    """``slice_args``: the slice these hosts are of (default host ``hosts`` of v4-16 'multi');
    ``cpus``: each host node's."""
    tag = "-".join([hosts, *slice_args[1::2]]) if slice_args else hosts
    slice_args = list(slice_args) or ["--topology", "2x2x2", "--slice-name", "multi"]
    log = log_dir / f"machine-{tag}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "xlasim",
                "ray-node",
                *slice_args,
                "--accelerator",
                "v4",
                "--hosts",
                hosts,
                "--num-cpus-per-host",
                str(cpus),
                "--address",
                address,
                "--hosts-port",
                str(hosts_port),
                "--log-dir",
                str(log_dir / f"nodes-{tag}"),
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
            ],
            env=cluster_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Machine(hosts, proc, log)


def _join(machine: Machine) -> Machine:
    """Wait (bounded) until the machine's nodes have joined the cluster."""
    _wait_for(
        lambda: "are Ray nodes of" in machine.output() or machine.process.poll() is not None,
        NODE_START_BOUND_S,
        f"xlasim ray-node --hosts {machine.hosts} joining",
        machine.output,
    )
    assert machine.process.poll() is None, machine.output()
    return machine


def _stop_machine(machine: Machine) -> None:
    """SIGTERM (it stops its nodes), then whatever is left, by process group."""
    pids = machine.node_pids()
    if machine.process.poll() is None:
        os.kill(machine.process.pid, signal.SIGTERM)
    try:
        machine.process.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(machine.process.pid, signal.SIGKILL)
        machine.process.wait()
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _live_cluster(tpu_clusters, machines_args, cpus_per_host=1):
    """A head and one `xlasim ray-node` machine per (hosts, slice arguments) of
    ``machines_args``, on a cluster of their own; all stopped on every exit path."""
    # Its nodes are started beside this process: no other cluster of this process runs then.
    tpu_clusters.release()
    # Short: Ray's socket paths under the temp dir have a length limit.
    temp_dir = Path(tempfile.mkdtemp(prefix="xrn-"))
    log_dir = temp_dir / "logs"
    log_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "RAY_"))}
    env.update(RAY_TEST_ENV)  # the Ray settings of every cluster the tests start
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # A cluster of our own, with its own token: no one else's driver or node joins it.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = ray_node.start_node(
        "head",
        ray_node.head_command(port, temp_dir),
        env,
        log_dir / "head.log",
        timeout_s=NODE_START_BOUND_S,
    )
    machines: list[Machine] = []
    hosts_port = free_port()  # the same on every machine: where host 0 listens
    try:
        # One machine after the other: each raylet must register within Ray's fixed 30 s.
        for hosts, slice_args in machines_args:
            machines.append(
                _start_machine(
                    hosts, env, address, hosts_port, temp_dir, log_dir, slice_args, cpus_per_host
                )
            )
            _join(machines[-1])
        yield LiveCluster(address, env, machines, temp_dir)
    finally:
        for machine in machines:
            _stop_machine(machine)
        ray_node.stop_nodes([head], grace_s=0)
        shutil.rmtree(temp_dir, ignore_errors=True)


_DRIVER = r"""
import json, sys
import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig

import tpu_backend
from xlasim.cli import demo
from xlasim.ray.cluster import error_chain_text, fit_with_deadline, release_placement_groups

steps, out_dir, storage, bound = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
ray.init()  # RAY_ADDRESS and RAY_RUNTIME_ENV_HOOK come from the environment
nodes = [
    {"labels": n["Labels"], "resources": n["Resources"]} for n in ray.nodes() if n["Alive"]
]
trainer = tpu_backend.TorchTrainer(
    demo.train_loop,
    train_loop_config={"steps": steps, "batch": 32, "out_dir": out_dir, "report_every": 10**6},
    scaling_config=ScalingConfig(
        use_tpu=True, topology="2x2x2", accelerator_type="TPU-V4", num_workers=2
    ),
    run_config=RunConfig(
        name="multi-node", storage_path=storage, failure_config=FailureConfig(max_failures=0)
    ),
)
result = {"nodes": nodes, "error": None}
try:
    fit_with_deadline(trainer, bound, release_after=False)
except Exception as exc:
    result["error"] = error_chain_text(exc)
# What Ray Train itself left behind, then what the helper had to release.
result["placement_groups_left"] = release_placement_groups()
print("RESULT " + json.dumps(result), flush=True)
"""

_CHECK = r"""
import json
import ray
from ray._private import state

ray.init()
pgs = [
    pg for pg in (ray.util.placement_group_table() or {}).values()
    if pg.get("state") != "REMOVED"
]
actors = [
    (a.get("ActorClassName") or a.get("Name"), a.get("State"))
    for a in state.actors().values() if a.get("State") != "DEAD"
]
print("CHECK " + json.dumps({"placement_groups": len(pgs), "actors": actors}), flush=True)
"""


def _driver(cluster: LiveCluster, code: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    env = dict(
        cluster.env,
        RAY_ADDRESS=cluster.address,
        RAY_RUNTIME_ENV_HOOK="xlasim.ray.node.with_simulation",
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str], tag: str, bound_s: float) -> dict:
    try:
        out, _ = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise TimeoutError(
            f"the driver did not finish within {bound_s:g}s:\n{out[-4000:]}"
        ) from None
    lines = [line for line in out.splitlines() if line.startswith(tag + " ")]
    assert proc.returncode == 0 and lines, out[-6000:]
    return json.loads(lines[-1][len(tag) + 1 :])


# Ray Train's one coordinator per cluster (get-or-create, detached): shared by every run.
_CLUSTER_SINGLETONS = ("_AutoscalingCoordinatorActor",)


def _assert_nothing_left(cluster: LiveCluster, cwd: Path) -> None:
    """No placement group and no actor of a finished run is left (a new driver looks)."""
    left = _finish(_driver(cluster, _CHECK, cwd=cwd), "CHECK", DRIVER_BOUND_S)
    assert left["placement_groups"] == 0, left
    singletons = [a for a in left["actors"] if a[0] in _CLUSTER_SINGLETONS]
    assert len(singletons) <= 1 and len(left["actors"]) == len(singletons), left


@pytest.fixture
def two_slice_cluster(tpu_clusters):
    """The one host of each slice of a 2 x v4-8 job, started separately as on two machines,
    agreeing only on the job's name and exchange port (a cluster of their own: Ray places a
    single-host slice's workers on any node with the chips, another slice's hosts included)."""
    machines_args = [
        (
            "0",
            ["--topology", "2x2x1", "--slice-name", "ms", "--num-slices", "2", "--slice-index", i],
        )
        for i in ("0", "1")
    ]
    with _live_cluster(tpu_clusters, machines_args) as cluster:
        yield cluster


_TWO_SLICE_DRIVER = r"""
import json, sys
import ray
from xlasim.cli import demo
from xlasim.ray.cluster import error_chain_text, release_placement_groups

steps, batch, out_dir, storage, bound = sys.argv[1:]
ray.init()  # RAY_ADDRESS and RAY_RUNTIME_ENV_HOOK come from the environment
result = {"error": None}
try:
    demo.run(
        "2x2x1", "v4", steps=int(steps), batch=int(batch), num_slices=2, out_dir=out_dir,
        storage_path=storage, fit_timeout_s=float(bound),
    )
except Exception as exc:
    result["error"] = error_chain_text(exc)
result["placement_groups_left"] = release_placement_groups()
print("RESULT " + json.dumps(result), flush=True)
"""


def test_two_slices_on_two_machines_train_as_one_slice(two_slice_cluster, tmp_path):
    steps, batch = 2, 32
    out_dir = tmp_path / "records"
    out_dir.mkdir()
    args = (str(steps), str(batch), str(out_dir), str(tmp_path / "results"), str(FIT_BOUND_S))
    result = _finish(
        _driver(two_slice_cluster, _TWO_SLICE_DRIVER, *args, cwd=tmp_path), "RESULT", DRIVER_BOUND_S
    )
    assert result["error"] is None, result["error"]
    for machine, name in zip(two_slice_cluster.machines, ("ms-0", "ms-1"), strict=True):
        assert f"(slice {name}, " in machine.output()

    from xlasim.cli import demo

    # slice 1's host found slice 0's host 0 on the other machine: one exchange, one program
    check_two_slice_records(demo.read_records(out_dir), steps, batch)
    assert result["placement_groups_left"] == 0
    _assert_nothing_left(two_slice_cluster, tmp_path)


@pytest.fixture(scope="module")
def live_cluster(tpu_clusters):
    # A CPU per chip: Ray's own TorchTrainer gives each TPU worker one beside its chip.
    with _live_cluster(tpu_clusters, [("0", ()), ("1", ())], cpus_per_host=4) as cluster:
        yield cluster


def test_an_unchanged_driver_trains_on_hosts_of_two_machines(live_cluster, tmp_path):
    out_dir = tmp_path / "records"
    out_dir.mkdir()
    proc = _driver(
        live_cluster, _DRIVER, "4", str(out_dir), str(tmp_path / "results"), str(FIT_BOUND_S),
        cwd=tmp_path,
    )  # fmt: skip
    result = _finish(proc, "RESULT", DRIVER_BOUND_S)
    assert result["error"] is None, result["error"]

    # the nodes Ray sees: a TPU-less head and one node per host, from the two machines
    tpu_nodes = sorted(
        (n for n in result["nodes"] if "TPU" in n["resources"]),
        key=lambda n: n["labels"]["ray.io/tpu-worker-id"],
    )
    assert len(result["nodes"]) == 3 and len(tpu_nodes) == 2
    for host, node in enumerate(tpu_nodes):
        assert node["labels"]["ray.io/tpu-worker-id"] == str(host)
        assert node["labels"]["ray.io/tpu-slice-name"] == "multi"
        assert node["resources"]["TPU"] == 4
        assert ("TPU-v4-16-head" in node["resources"]) == (host == 0)

    from xlasim.cli import demo

    records = demo.read_records(out_dir)
    assert [r["host_index"] for r in records] == [0, 1]
    for r in records:
        assert r["tpu_worker_id"] == str(r["host_index"])
        assert (r["process_index"], r["process_count"]) == (r["host_index"], 2)
        assert (r["global_devices"], r["addressable_devices"]) == (8, 4)
        assert r["mesh_shape"] == [2, 4] and r["spmd"] is True
    # one global program on both hosts: the same, decreasing loss
    losses = records[0]["losses"]
    assert len(losses) == 4 and records[1]["losses"] == losses
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert result["placement_groups_left"] == 0
    _assert_nothing_left(live_cluster, tmp_path)


_TORCH_TPU_DRIVER = r"""
import json, sys
out, storage, tests, bound = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sys.path.insert(0, tests)
import ray
import ray.cloudpickle
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import torch_tpu_ddp
from xlasim.ray.cluster import error_chain_text, fit_with_deadline

ray.init()  # RAY_ADDRESS and RAY_RUNTIME_ENV_HOOK come from the environment
ray.cloudpickle.register_pickle_by_value(torch_tpu_ddp)
trainer = TorchTrainer(
    torch_tpu_ddp.train_loop,
    train_loop_config={"out": out},
    scaling_config=ScalingConfig(
        use_tpu=True,
        topology="2x2x2",
        accelerator_type="TPU-V4",
        num_workers=8,
        resources_per_worker={"TPU": 1},
    ),
    run_config=RunConfig(
        name="torch-tpu", storage_path=storage, failure_config=FailureConfig(max_failures=0)
    ),
)
result = {"error": None}
try:
    fit_with_deadline(trainer, bound)
except Exception as exc:
    result["error"] = error_chain_text(exc)
print("RESULT " + json.dumps(result), flush=True)
"""


@pytest.mark.skipif(
    torch.__version__ < "2.11",
    reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__}",
)
def test_rays_own_torch_trainer_trains_torch_tpu_ddp_on_the_machines(live_cluster, tmp_path):
    # Ray 2.60's TorchTrainer(use_tpu=True) unchanged: tpu_dist, one worker per chip of both
    # machines' hosts, TorchTPU loaded by Ray on each; losses as one eager CPU process's.
    out_dir = tmp_path / "records"
    out_dir.mkdir()
    proc = _driver(
        live_cluster, _TORCH_TPU_DRIVER, str(out_dir), str(tmp_path / "results"),
        str(Path(__file__).parent), str(FIT_BOUND_S), cwd=tmp_path,
    )  # fmt: skip
    result = _finish(proc, "RESULT", DRIVER_BOUND_S)
    assert result["error"] is None, result["error"]
    torch_tpu_ddp.check_records(out_dir, hosts=2, chips=4)
    _assert_nothing_left(live_cluster, tmp_path)


def test_a_killed_node_fails_the_run_clearly_and_leaves_nothing(live_cluster, tmp_path):
    machine = live_cluster.machines[1]
    (victim,) = machine.node_pids().values()
    out_dir = tmp_path / "records"
    out_dir.mkdir()
    # A run too long to end by itself: only the failure (or the bound) ends it.
    proc = _driver(
        live_cluster, _DRIVER, str(10**7), str(out_dir), str(tmp_path / "results"),
        str(FIT_BOUND_S), cwd=tmp_path,
    )  # fmt: skip
    try:
        from xlasim.cli import demo

        def both_hosts_training() -> bool:
            progress = demo.read_progress(out_dir)
            return all(progress.get(h) and progress[h][-1]["step"] >= 1 for h in (0, 1))

        _wait_for(
            lambda: both_hosts_training() or proc.poll() is not None,
            FIT_BOUND_S,
            "both hosts training",
            lambda: str(demo.read_progress(out_dir)),
        )
        assert proc.poll() is None, proc.communicate()[0][-6000:]
        os.killpg(victim, signal.SIGKILL)  # host 1's machine is gone
        killed_at = time.monotonic()
        result = _finish(proc, "RESULT", DRIVER_BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    error = result["error"]
    assert error is not None and "did not finish within" not in error, error
    # Ray Train's own words for a worker whose node is gone
    assert re.search(r"WorkerHealthCheckFailedError|ActorDiedError|ActorUnavailableError", error)
    assert "RayTrainWorker" in error, error
    print(f"run failed {time.monotonic() - killed_at:.1f}s after the node was killed")
    # Ray Train released the slice itself; and once the driver is gone, nothing of it is left
    assert result["placement_groups_left"] == 0
    _assert_nothing_left(live_cluster, tmp_path)
    # the machine that lost its node says so and exits
    machine.process.wait(timeout=STOP_BOUND_S)
    assert machine.process.returncode == 1
    assert "host 1's Ray node exited" in machine.output()
