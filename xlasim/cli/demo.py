"""``xlasim demo``: train a small model with ``tpu_backend.TorchTrainer`` on a simulated slice.

Starts a local Ray cluster whose nodes look like the slice's TPU hosts
(:mod:`xlasim.ray.cluster`), runs an SPMD training loop on every host (one Ray Train worker
per host, placed by Ray's own ``SlicePlacementGroup``), and prints the slice, the mesh the
backend built, the per-step loss every host saw, and the compile counts.

The training loop (:func:`train_loop`) is plain torch_xla SPMD code: nothing in it knows
it is simulated.  It is also what the tests and ``bench/bench_fit.py`` run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

import tpu_backend
from tpu_backend.topology import parse_slice
from xlasim.arguments import (
    OneLineErrorParser,
    positive_float,
    positive_int,
    reject_dash_topologies,
)
from xlasim.cli.describe import slice_table
from xlasim.ray.cluster import (
    ClusterStartError,
    error_chain_text,
    fit_with_deadline,
    machine_load,
    simulated_tpu_cluster,
)
from xlasim.runtime.device import ensure_device_guard

__all__ = ["train_loop", "run", "main", "read_progress", "read_records"]

DEFAULT_TOPOLOGY = "2x2x2"
DEFAULT_ACCELERATOR = "v4"
MAX_DEMO_HOSTS = 8
"""Each host is a Ray node (a raylet and its workers) on this one machine."""
# A loaded 2-core machine can take minutes to start a few Ray nodes (each raylet must
# register within Ray's fixed 30 s, which is why a failed attempt is retried).
DEFAULT_STARTUP_TIMEOUT_S = 300.0


def train_loop(config: dict[str, Any]) -> None:
    """One SPMD training run; each host writes what it saw to ``config['out_dir']``.

    A 2-layer MLP on a fixed regression problem.  The global batch is built identically
    on every host and sharded along the mesh's first axis ('data'); parameters are
    replicated.  Every host therefore computes the same loss, and the loss goes down.
    """
    # Imported on the worker, where torch_xla is the simulator (or the real runtime); the
    # driver never imports it, and Ray is optional.
    import ray.train
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    steps = int(config.get("steps", 5))
    batch = int(config.get("batch", 64))
    width = int(config.get("width", 32))
    report_every = int(config.get("report_every", 1))
    mesh = tpu_backend.get_xla_mesh()
    state = tpu_backend.get_xla_worker_state()
    assert mesh is not None and state is not None, "not running on the tpu_backend XLA backend"

    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 16, generator=gen)
    w = torch.randn(16, 1, generator=gen)
    y = torch.tanh(x @ w)
    data_axis = mesh.axis_names[0]
    xd = x.to(device)
    yd = y.to(device)
    spec_x = (data_axis,) + (None,) * (xd.dim() - 1)
    xs.mark_sharding(xd, mesh, spec_x)
    xs.mark_sharding(yd, mesh, spec_x)

    out_dir = config.get("out_dir")
    # Files and lines by process index: host indices repeat in every slice of a multislice run.
    me = state.process_index
    progress = Path(out_dir) / f"progress-host{me}.jsonl" if out_dir else None
    _append_progress(progress, {"step": -1})  # the worker is up, step 0 (and its compile) next

    losses: list[float] = []
    t_first = None
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xd), yd)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        value = float(loss.item())
        losses.append(value)
        if t_first is None:
            t_first = time.time()
        _append_progress(progress, {"step": step, "loss": value})
        if step % report_every == 0 or step == steps - 1:
            print(f"[host {me}] step {step} loss {value:.6f}", flush=True)
            ray.train.report({"step": step, "loss": value, "host_index": state.host_index})

    record = {
        "host_index": state.host_index,
        "slice_index": state.slice_index,
        "num_slices": state.num_slices,
        "tpu_worker_id": os.environ.get("TPU_WORKER_ID"),
        "ray_world_rank": ray.train.get_context().get_world_rank(),
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "global_devices": xr.global_runtime_device_count(),
        "addressable_devices": xr.addressable_runtime_device_count(),
        "device_type": xr.device_type(),
        "spmd": xr.is_spmd(),
        "mesh_shape": list(mesh.mesh_shape),
        "mesh_device_ids": [int(d) for d in mesh.device_ids],
        "megascale_slice_id": os.environ.get("MEGASCALE_SLICE_ID"),
        "axis_names": list(mesh.axis_names),
        "is_xla_backend": tpu_backend.is_xla_backend(),
        "process_group": state.process_group_backend,
        "losses": losses,
        "uncached_compile": met.counter_value("UncachedCompile"),
        "cached_compile": met.counter_value("CachedCompile"),
        "first_step_time": t_first,
        "pid": os.getpid(),
    }
    if out_dir:
        path = Path(out_dir) / f"host{me}.json"
        path.write_text(json.dumps(record))


def _append_progress(path: Path | None, entry: dict[str, Any]) -> None:
    # One JSON line per event, for the driver's progress display (:class:`_ProgressView`).
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps(entry) + "\n")


def read_progress(out_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Host index -> the progress entries :func:`train_loop` appended so far."""
    progress: dict[int, list[dict[str, Any]]] = {}
    for path in Path(out_dir).glob("progress-host*.jsonl"):
        host = int(path.stem.removeprefix("progress-host"))
        # A line being written may be incomplete; it is read again on the next poll.
        lines = path.read_text().splitlines()
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break
        progress[host] = entries
    return progress


def read_records(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-host records :func:`train_loop` wrote, in process order (slice by slice)."""
    records = [json.loads(p.read_text()) for p in Path(out_dir).glob("host*.json")]
    return sorted(records, key=lambda r: r["process_index"])


def run(
    topology: str = DEFAULT_TOPOLOGY,
    accelerator: str | None = DEFAULT_ACCELERATOR,
    *,
    steps: int = 5,
    batch: int = 64,
    out_dir: str | None = None,
    storage_path: str | None = None,
    torch_config: Any = None,
    fit_timeout_s: float = 600.0,
    watch: Callable[[str], None] | None = None,
    num_slices: int = 1,
) -> tuple[Any, list[dict[str, Any]]]:
    """Train :func:`train_loop` on a connected (simulated) TPU Ray cluster.

    Returns the Ray ``Result`` and the per-host records.  The caller owns the cluster
    (see :func:`xlasim.ray.cluster.simulated_tpu_cluster`).  ``watch`` is called with the
    records directory while the run goes on (:func:`read_progress` reads it).
    """
    # Deferred: Ray is optional (the `ray` extra); the module imports without it.
    from ray.train import RunConfig, ScalingConfig

    spec = parse_slice(topology, accelerator)
    if num_slices > 1 and torch_config is None:
        torch_config = tpu_backend.TPUTorchConfig(num_slices=num_slices)
    with tempfile.TemporaryDirectory(prefix="xlasim-demo-") as tmp:
        out = out_dir or os.path.join(tmp, "records")
        os.makedirs(out, exist_ok=True)
        trainer = tpu_backend.TorchTrainer(
            train_loop,
            train_loop_config={"steps": steps, "batch": batch, "out_dir": out},
            torch_config=torch_config,
            scaling_config=ScalingConfig(  # type: ignore[call-arg]  # Train V2's config
                use_tpu=True,
                topology=spec.topology,
                accelerator_type=spec.ray_accelerator_type,
                num_workers=spec.num_hosts * num_slices,
            ),
            run_config=RunConfig(
                name=f"xlasim-demo-{spec.pod_type}-{int(time.time())}",
                storage_path=storage_path or os.path.join(tmp, "ray_results"),
            ),
        )
        poll = (lambda: watch(out)) if watch is not None else None
        result = fit_with_deadline(trainer, fit_timeout_s, poll=poll)
        return result, read_records(out)


def _print_report(spec: Any, records: list[dict[str, Any]], elapsed: float) -> bool:
    console = Console()
    if not records:
        console.print("[red]no host reported a result[/red]")
        return False
    first = records[0]
    console.print(
        f"mesh {tuple(first['mesh_shape'])} {tuple(first['axis_names'])}, "
        f"{first['global_devices']} devices, {first['addressable_devices']} per host, "
        f"{first['process_group']} process group"
    )
    hosts = Table(title="Hosts")
    for col in (
        "host",
        "TPU worker id",
        "Ray rank",
        "process",
        "devices",
        "uncached compiles",
        "cached compiles",
    ):
        hosts.add_column(col)
    for r in records:
        hosts.add_row(
            _host_name(r),
            str(r["tpu_worker_id"]),
            str(r["ray_world_rank"]),
            f"{r['process_index']}/{r['process_count']}",
            f"{r['addressable_devices']}/{r['global_devices']}",
            str(r["uncached_compile"]),
            str(r["cached_compile"]),
        )
    console.print(hosts)
    losses = Table(title="Loss per step (every host)")
    losses.add_column("step")
    for r in records:
        name = _host_name(r)
        losses.add_column(name if name.startswith("slice") else f"host {name}")
    for step in range(len(first["losses"])):
        losses.add_row(str(step), *(f"{r['losses'][step]:.6f}" for r in records))
    console.print(losses)
    same = all(r["losses"] == first["losses"] for r in records)
    down = first["losses"][-1] < first["losses"][0]
    console.print(
        f"every host saw the same loss: {'yes' if same else '[red]NO[/red]'}; "
        f"loss went down: {'yes' if down else '[red]NO[/red]'}; wall time {elapsed:.1f}s"
    )
    return same and down


class _ProgressView:
    """Training progress on the driver, from the hosts' progress files.

    On a terminal: one bar per host (steps done, last loss).  Elsewhere (CI logs): one plain
    line when every host's worker is up and one per step once every host has finished it,
    never one line per host.
    """

    def __init__(self, console: Console, num_hosts: int, steps: int) -> None:
        self._console = console
        self._num_hosts = num_hosts
        self._steps = steps
        self._bars: Progress | None = None
        self._tasks: dict[int, TaskID] = {}
        self._announced = -2  # last step reported in plain mode (-1: workers up)
        if console.is_terminal:
            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            for host in range(num_hosts):
                self._tasks[host] = self._bars.add_task(
                    f"host {host}", total=steps, note="waiting for its Ray Train worker"
                )

    def __enter__(self) -> _ProgressView:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def update(self, out_dir: str) -> None:
        progress = read_progress(out_dir)
        if self._bars is not None:
            for host, entries in progress.items():
                if host not in self._tasks or not entries:
                    continue
                last = entries[-1]
                done = last["step"] + 1
                note = "step 0 (compiles)" if done == 0 else f"loss {last['loss']:.6f}"
                self._bars.update(self._tasks[host], completed=done, note=note)
            return
        if len(progress) < self._num_hosts:
            return
        reached = min((e[-1]["step"] if e else -2) for e in progress.values())
        while self._announced < reached:
            self._announced += 1
            if self._announced == -1:
                self._console.print(f"workers up on all {self._num_hosts} host(s)")
            else:
                loss = progress[0][self._announced + 1]["loss"]
                self._console.print(
                    f"step {self._announced + 1}/{self._steps} done on every host (loss {loss:.6f})"
                )


def _host_name(record: dict[str, Any]) -> str:
    """'1' for host 1; 'slice 1 host 0' in a multislice run (host indices are per slice)."""
    if record.get("num_slices", 1) > 1:
        return f"slice {record['slice_index']} host {record['host_index']}"
    return str(record["host_index"])


def _fail(console: Console, what: str, hint: str) -> int:
    # One line on stderr: the CLI never shows a traceback for a failed run.
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"xlasim demo: {what}; {hint}", markup=False
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="xlasim demo",
        description="Train a small model with tpu_backend.TorchTrainer on a simulated TPU "
        "slice (a local Ray cluster whose nodes look like the slice's hosts).",
    )
    parser.add_argument(
        "--topology",
        default=DEFAULT_TOPOLOGY,
        help=f"chip grid, e.g. 2x2x2 or 4x4 (default {DEFAULT_TOPOLOGY})",
    )
    parser.add_argument(
        "--accelerator",
        default=None,
        help="TPU generation, e.g. v4, v5p, v6e (default: v4 for the default "
        "topology, else the project's default for 2-D topologies)",
    )
    parser.add_argument(
        "--num-slices",
        type=positive_int,
        default=1,
        help="slices of the topology joined over DCN, one Ray node per host of each (default 1)",
    )
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        help="seconds the training may take before it is abandoned (default 600)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=positive_float,
        default=DEFAULT_STARTUP_TIMEOUT_S,
        help="seconds one attempt to start the local Ray cluster may take; a failed "
        f"attempt is retried once (default {DEFAULT_STARTUP_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="forward the Ray workers' logs (per-step lines of every host) and Ray's own "
        "INFO lines",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    reject_dash_topologies(parser, argv)
    args = parser.parse_args(argv)
    accelerator = args.accelerator
    if accelerator is None and args.topology == DEFAULT_TOPOLOGY:
        accelerator = DEFAULT_ACCELERATOR
    try:
        spec = parse_slice(args.topology, accelerator)
    except ValueError as e:
        parser.error(str(e))
    num_hosts = spec.num_hosts * args.num_slices
    if num_hosts > MAX_DEMO_HOSTS:
        slices = f"{args.num_slices} x " if args.num_slices > 1 else ""
        parser.error(
            f"{slices}{spec.pod_type} ({spec.topology}) has {num_hosts} hosts; the demo starts one "
            f"local Ray node per host and runs at most {MAX_DEMO_HOSTS}: pick a smaller slice, "
            f"e.g. 2x2x2 (2 hosts)"
        )
    console = Console()
    console.print(slice_table(spec, args.num_slices))

    # Build the simulator's C++ extension here, where its first-use note reaches the
    # terminal: built in the workers, it took minutes with no line on screen; now they load
    # the cached build.
    ensure_device_guard()
    t0 = time.monotonic()
    console.print(f"starting a local Ray cluster with {num_hosts} simulated TPU host(s)...")
    try:
        # Worker logs stay in the cluster's log files (--verbose shows them): without a
        # dashboard Ray Train's placement-group cleaner warns every second.
        with simulated_tpu_cluster(
            spec.topology,
            spec.accelerator,
            num_slices=args.num_slices,
            log_to_driver=args.verbose,
            driver_log_level=None if args.verbose else logging.WARNING,
            startup_timeout_s=args.startup_timeout,
            progress=lambda line: console.print(f"  {line}", highlight=False),
        ) as cluster:
            console.print(
                f"cluster up in {cluster.startup_s:.1f}s; training {args.steps} steps on "
                f"{num_hosts} host(s) (one Ray Train worker per host)..."
            )
            with _ProgressView(console, num_hosts, args.steps) as view:
                _, records = run(
                    spec.topology,
                    spec.accelerator,
                    steps=args.steps,
                    batch=args.batch,
                    fit_timeout_s=args.timeout,
                    watch=view.update,
                    num_slices=args.num_slices,
                )
    except ClusterStartError as e:
        return _fail(
            console,
            str(e),
            "try: run it again; give start-up longer (--startup-timeout "
            f"{2 * args.startup_timeout:g}); or a smaller slice (--topology 2x2x1 "
            "--accelerator v4, one host)",
        )
    except TimeoutError as e:
        return _fail(
            console,
            f"{e} ({machine_load()})",
            f"try: a longer bound (--timeout {2 * args.timeout:g}) or fewer --steps; "
            "--verbose shows where the workers are",
        )
    except Exception as e:
        causes = error_chain_text(e).splitlines()
        return _fail(
            console,
            f"training failed: {causes[-1] if causes else type(e).__name__}",
            "--verbose shows the workers' logs",
        )
    ok = _print_report(spec, records, time.monotonic() - t0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
