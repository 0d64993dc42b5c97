"""Fault drills on a simulated multi-host TPU slice under Ray Train (tests and bench share them).

One training loop (:func:`drill_loop`) runs on every host of the slice: a linear model on the
simulated TPU, a fresh host-entered batch sharded over the hosts every step (the simulated
hosts' data exchange), a ``dist.all_reduce`` over the backend's gloo group, and a checkpoint
every ``ckpt_every`` steps written by every host.  One host injects one fault at one step, once
per drill (a marker file keeps the retry clean), once the controller has registered the
checkpoint before that step (so what a retry resumes from does not depend on its polling):

* ``kill``: the host's worker process SIGKILLs itself;
* ``raise``: the training loop raises;
* ``hang_exchange`` / ``hang_all_reduce``: the host sleeps "forever" just before the hosts'
  data exchange / the all-reduce, so the other hosts wait in it;
* ``kill_coordinator``: as ``kill``, on host 0, which runs the stores the hosts meet at;
* ``kill_in_save``: the host SIGKILLs itself while ``ray.train.report(checkpoint=...)`` copies
  its checkpoint files into storage.

Each host appends what it did to ``out/host{i}.jsonl`` (wall-clock times: every process runs on
this machine), so a drill can tell which steps ran in which attempt, which checkpoint a retry
resumed from and how long after the fault the error or the recovery came.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sockets
from ray.train import UserCallback

FEATURES = 16
PAD_FILES = 256
"""Files each host adds to its checkpoint (64 KiB each): the copy into storage takes long
enough for ``kill_in_save`` to land while it is under way."""
PAD_BYTES = 64 * 1024
HANG_S = 3600.0
"""How long a hanging host sleeps: far past every bound under test (Ray ends the process)."""

CLUSTER_ACTORS = ("_AutoscalingCoordinatorActor",)
"""Ray's own actors that live as long as the cluster (started by the first run, shared by the
next ones): not something a run leaves behind."""

FAULTS = ("kill", "raise", "hang_exchange", "hang_all_reduce", "kill_coordinator", "kill_in_save")


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _fire_once(out: Path) -> bool:
    """True for the first caller across every attempt of a drill (an exclusive create)."""
    try:
        fd = os.open(out / "fault-fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _kill_when_copy_starts(storage: Path, host: int, log: Path) -> None:
    """SIGKILL this process as soon as the first of its checkpoint files shows up in storage,
    i.e. while Ray is still copying the rest (``copied`` in the log says how far it got)."""
    run_dir = storage / "drill"
    prefix = f"host{host}-pad-"

    def copied_per_dir() -> dict[str, int]:
        try:
            return {
                d.name: sum(1 for f in os.scandir(d.path) if f.name.startswith(prefix))
                for d in os.scandir(run_dir)
                if d.name.startswith("checkpoint_") and d.is_dir()
            }
        except FileNotFoundError:  # not created yet
            return {}

    # This host's files of earlier checkpoints are there already; the other hosts may have
    # created this one's directory already.
    earlier = {name for name, count in copied_per_dir().items() if count}
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        for name, copied in copied_per_dir().items():
            if name not in earlier and copied:
                _append(log, {"event": "fault", "t": time.time(), "copied": copied})
                os.kill(os.getpid(), 9)
        time.sleep(0.001)


REGISTER_WAIT_S = 120.0
"""Bound on the controller registering a checkpoint (it collects reports when it polls the
workers, which a loaded machine delays)."""


class Registered(UserCallback):
    """Runs in the controller (a ``UserCallback``): writes ``out/registered-{step}`` once a
    checkpoint counts, i.e. every worker reported it."""

    def __init__(self, out: str) -> None:
        self.out = out

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        if checkpoint is not None:
            (Path(self.out) / f"registered-{metrics[0]['step']}").write_text("")


def _wait_registered(out: Path, step: int, ckpt_every: int) -> None:
    """Before a fault at ``step``: the checkpoint before it counts, so what a retry must resume
    from does not depend on how fast the controller polls."""
    last = (step // ckpt_every) * ckpt_every - 1
    if last < 0:
        return
    deadline = time.monotonic() + REGISTER_WAIT_S
    while not (out / f"registered-{last}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"drill: the checkpoint of step {last} was not registered within "
                f"REGISTER_WAIT_S={REGISTER_WAIT_S:g} s"
            )
        time.sleep(0.05)


def _read_checkpoint(path: Path, num_hosts: int) -> tuple[int, Any]:
    import torch  # on the worker, where torch is the simulator's

    meta = json.loads((path / "meta.json").read_text())
    for host in range(num_hosts):
        pads = list(path.glob(f"host{host}-pad-*"))
        if len(pads) != PAD_FILES or not (path / f"host{host}-done").exists():
            raise RuntimeError(
                f"checkpoint {path.name} of step {meta['step']} is incomplete: host {host} has "
                f"{len(pads)} of {PAD_FILES} files"
            )
    return int(meta["step"]), torch.load(path / "weights.pt")


def drill_loop(config: dict[str, Any]) -> None:
    """The training function of every host (see the module docstring)."""
    # Imported on the worker, where torch_xla is the simulator.
    import ray.train
    import torch

    import tpu_backend

    out = Path(config["out"])
    state = tpu_backend.get_xla_worker_state()
    mesh = tpu_backend.get_xla_mesh()
    assert state is not None and mesh is not None
    host, num_hosts = state.host_index, state.num_hosts
    log = out / f"host{host}.jsonl"

    start, weights, resumed_from = 0, torch.zeros(FEATURES, 1), None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            last, weights = _read_checkpoint(Path(d), num_hosts)
        start, resumed_from = last + 1, last
    _append(
        log,
        {"event": "start", "t": time.time(), "pid": os.getpid(), "resumed_from": resumed_from},
    )

    try:
        _train(config, out, log, host, num_hosts, mesh, start, weights)
    except BaseException as exc:
        # When the surviving hosts learn of the fault, and how they are told.
        _append(log, {"event": "error", "t": time.time(), "error": f"{type(exc).__name__}: {exc}"})
        raise


def _train(
    config: dict[str, Any],
    out: Path,
    log: Path,
    host: int,
    num_hosts: int,
    mesh: Any,
    start: int,
    weights: Any,
) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    import torch_xla
    import torch_xla.distributed.spmd as xs

    steps, ckpt_every = int(config["steps"]), int(config["ckpt_every"])
    fault, fault_host, fault_step = config.get("fault"), config.get("host"), config.get("step")
    device = torch_xla.device()
    w = weights.to(device)
    true_w = torch.linspace(-1.0, 1.0, FEATURES).reshape(FEATURES, 1)
    for step in range(start, steps):
        firing = fault_host == host and fault_step == step and _fire_once(out)
        if firing:
            _wait_registered(out, step, ckpt_every)
        if firing and fault in ("kill", "kill_coordinator"):
            _append(log, {"event": "fault", "t": time.time()})
            os.kill(os.getpid(), 9)
        if firing and fault == "raise":
            _append(log, {"event": "fault", "t": time.time()})
            raise RuntimeError(f"drill: host {host} raised at step {step}")
        if firing and fault == "hang_exchange":
            _append(log, {"event": "fault", "t": time.time()})
            time.sleep(HANG_S)
        # The step's batch enters the devices from the hosts: the simulated hosts exchange it.
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(32, FEATURES, generator=gen)
        xd = x.to(device)
        xs.mark_sharding(xd, mesh, (mesh.axis_names[0], None))
        yd = (x @ true_w).to(device)
        w.requires_grad_(True)
        loss = torch.nn.functional.mse_loss(xd @ w, yd)
        (grad,) = torch.autograd.grad(loss, [w])
        w = (w - 0.1 * grad).detach()
        torch_xla.sync()
        value = float(loss.item())
        if firing and fault == "hang_all_reduce":
            _append(log, {"event": "fault", "t": time.time()})
            time.sleep(HANG_S)
        # Every host computed the same loss: the gloo group agrees.
        total = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(total)
        if abs(float(total) - value * num_hosts) > 1e-6 * num_hosts:
            raise RuntimeError(f"hosts disagree at step {step}: {float(total)} vs {value}")
        _append(log, {"event": "step", "step": step, "loss": value, "t": time.time()})
        if step == start:
            # The hosts have met (exchange, all-reduce): what this host listens on now.
            _append(
                log,
                {
                    "event": "listeners",
                    "listening": sockets.listening(os.getpid()),
                    "hosts_addr": os.environ.get("XLASIM_HOSTS_ADDR"),
                    "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
                },
            )
        metrics = {"step": step, "loss": value}
        if (step + 1) % ckpt_every == 0 or step == steps - 1:
            with tempfile.TemporaryDirectory() as d:
                path = Path(d)
                if host == 0:
                    torch.save(w.cpu(), path / "weights.pt")
                    (path / "meta.json").write_text(json.dumps({"step": step}))
                for i in range(PAD_FILES):
                    (path / f"host{host}-pad-{i:03d}").write_bytes(b"\0" * PAD_BYTES)
                (path / f"host{host}-done").write_text("")
                if firing and fault == "kill_in_save":
                    watcher = threading.Thread(
                        target=_kill_when_copy_starts,
                        args=(Path(config["storage"]), host, log),
                        daemon=True,
                    )
                    watcher.start()
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            _append(log, {"event": "checkpoint", "step": step, "t": time.time()})
        else:
            ray.train.report(metrics)


def read_log(out: Path, host: int) -> list[dict[str, Any]]:
    path = out / f"host{host}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class DrillResult:
    """What one drill ended in, read from the hosts' logs and the driver."""

    fault: str
    outcome: str  # "recovered" or "error"
    error: str = ""
    detection_s: float = float("nan")
    """From the fault to fit() raising (error) or to the retry's hosts starting (recovered)."""
    peer_error_s: float = float("nan")
    """From the fault to the first error on another host (how long a survivor waited)."""
    peer_error: str = ""
    bound: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """Per attempt (in order): the steps host 0 completed and the step it resumed after."""
    losses: dict[int, float] = field(default_factory=dict)
    fault_record: dict[str, Any] = field(default_factory=dict)


def attempts_of(out: Path) -> list[dict[str, Any]]:
    """Host 0's attempts: each 'start' opens one."""
    runs: list[dict[str, Any]] = []
    for rec in read_log(out, 0):
        if rec["event"] == "start":
            runs.append({"resumed_from": rec["resumed_from"], "t": rec["t"], "steps": []})
        elif rec["event"] == "step":
            runs[-1]["steps"].append(rec["step"])
    return runs


def fault_record(out: Path, num_hosts: int) -> dict[str, Any]:
    for host in range(num_hosts):
        for rec in read_log(out, host):
            if rec["event"] == "fault":
                return {"host": host, **rec}
    return {}


def expected_losses(steps: int) -> list[float]:
    """The loss of every step of an uninterrupted run, computed on the CPU."""
    import torch

    w = torch.zeros(FEATURES, 1)
    true_w = torch.linspace(-1.0, 1.0, FEATURES).reshape(FEATURES, 1)
    losses = []
    for step in range(steps):
        x = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(step))
        w.requires_grad_(True)
        loss = torch.nn.functional.mse_loss(x @ w, x @ true_w)
        (grad,) = torch.autograd.grad(loss, [w])
        w = (w - 0.1 * grad).detach()
        losses.append(float(loss))
    return losses


def losses_of(out: Path) -> dict[int, float]:
    """Host 0's loss at every step, the last attempt's value where a step ran twice."""
    return {r["step"]: r["loss"] for r in read_log(out, 0) if r["event"] == "step"}


def run_drill(
    fault: str,
    work: Path,
    *,
    host: int | None = None,
    step: int = 3,
    steps: int = 6,
    ckpt_every: int = 2,
    max_failures: int = 0,
    timeout_s: int = 1800,
    hosts_timeout_s: float | None = None,
    fit_timeout_s: float = 600.0,
    topology: str = "2x2x2",
    accelerator: str = "TPU-V4",
) -> tuple[DrillResult, BaseException | None]:
    """One drill on the connected simulated cluster; returns what it ended in and the error
    ``fit()`` raised (None when the run recovered and finished)."""
    import ray.cloudpickle
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.ray.cluster import error_chain_text, fit_with_deadline

    if host is None:
        host = 0 if fault == "kill_coordinator" else 1
    # Workers cannot import this helper module: ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(sockets)
    out, storage = work / "out", work / "storage"
    out.mkdir(parents=True, exist_ok=True)
    env = {"XLASIM_HOSTS_TIMEOUT_S": str(hosts_timeout_s)} if hosts_timeout_s else {}
    # The hosts compute at the precision the test runs at (its mat_mul_precision mark).
    precision = os.environ.get("XLASIM_MAT_MUL_PRECISION")
    if precision:
        env["XLASIM_MAT_MUL_PRECISION"] = precision
    callback = Registered(str(out))
    trainer = tpu_backend.TorchTrainer(
        drill_loop,
        train_loop_config={
            "out": str(out),
            "storage": str(storage),
            "steps": steps,
            "ckpt_every": ckpt_every,
            "fault": fault,
            "host": host,
            "step": step,
        },
        torch_config=tpu_backend.TPUTorchConfig(timeout_s=timeout_s),
        scaling_config=ScalingConfig(
            use_tpu=True, topology=topology, accelerator_type=accelerator, num_workers=2
        ),
        run_config=RunConfig(
            name="drill",
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            worker_runtime_env={"env_vars": env} if env else None,
            callbacks=[callback],
        ),
    )
    error: BaseException | None = None
    try:
        fit_with_deadline(trainer, fit_timeout_s)
    except Exception as exc:  # noqa: BLE001 - the drill reports whatever fit() raised
        error = exc
    t_end = time.time()
    record = fault_record(out, 2)
    runs = attempts_of(out)
    result = DrillResult(
        fault=fault,
        outcome="error" if error is not None else "recovered",
        error=error_chain_text(error) if error is not None else "",
        attempts=runs,
        losses=losses_of(out),
        fault_record=record,
    )
    if record:
        # Recovery: the retry's hosts are up again; error: fit() raised on the driver.
        later = [r["t"] for r in runs if r["t"] > record["t"]]
        end = t_end if error is not None or not later else later[0]
        result.detection_s = end - record["t"]
        peers = [
            r
            for h in range(2)
            if h != record["host"]
            for r in read_log(out, h)
            if r["event"] == "error" and r["t"] >= record["t"]
        ]
        if peers:
            first = min(peers, key=lambda r: r["t"])
            result.peer_error_s, result.peer_error = first["t"] - record["t"], first["error"]
    return result, error


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the number was reused by another user's process
        return False
    try:  # a zombie has exited: only its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def leftovers(out: Path, num_hosts: int = 2, wait_s: float = 120.0) -> list[str]:
    """What a finished drill left behind, after waiting up to ``wait_s`` for Ray's
    asynchronous cleanup: live placement groups, live actors, live worker processes."""
    import ray
    import ray._private.state

    pids = {r["pid"] for h in range(num_hosts) for r in read_log(out, h) if r["event"] == "start"}
    deadline = time.monotonic() + wait_s
    while True:
        found = [
            f"placement group {pg_id} is {info['state']}"
            for pg_id, info in (ray.util.placement_group_table() or {}).items()
            if info.get("state") != "REMOVED"
        ]
        found += [
            f"actor {info.get('ActorClassName', actor_id)} ({actor_id}) is ALIVE"
            for actor_id, info in ray._private.state.actors().items()
            if info.get("State") == "ALIVE" and info.get("ActorClassName") not in CLUSTER_ACTORS
        ]
        found += [f"worker process {pid} is alive" for pid in sorted(pids) if _pid_alive(pid)]
        if not found or time.monotonic() > deadline:
            return found + ([f"(still there after waiting {wait_s:g} s)"] if found else [])
        time.sleep(0.5)


def print_table(results: list[DrillResult], bounds: dict[str, str]) -> None:
    rows = [("fault", "outcome", "peer error s", "detection s", "bound")]
    for r in results:
        rows.append(
            (
                r.fault,
                r.outcome,
                f"{r.peer_error_s:.1f}",
                f"{r.detection_s:.1f}",
                bounds.get(r.fault, ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    sys.stdout.flush()
