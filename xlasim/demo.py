"""``xlasim demo``: train a small model with ``tpu_backend.TorchTrainer`` on a simulated slice.

Starts a local Ray cluster whose nodes look like the slice's TPU hosts
(:mod:`xlasim.ray_cluster`), runs an SPMD training loop on every host (one Ray Train worker
per host, placed by Ray's own ``SlicePlacementGroup``), and prints the slice, the mesh the
backend built, the per-step loss every host saw, and the compile counts.

The training loop (:func:`train_loop`) is plain torch_xla SPMD code: nothing in it knows
it is simulated.  It is also what the tests and ``bench/bench_fit.py`` run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import tpu_backend
from tpu_backend.topology import parse_slice
from xlasim.ray_cluster import fit_with_deadline, simulated_tpu_cluster
from xlasim.slice_table import slice_table

__all__ = ["train_loop", "run", "main", "read_records"]

DEFAULT_TOPOLOGY = "2x2x2"
DEFAULT_ACCELERATOR = "v4"


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
        if step % report_every == 0 or step == steps - 1:
            print(f"[host {state.host_index}] step {step} loss {value:.6f}", flush=True)
            ray.train.report({"step": step, "loss": value, "host_index": state.host_index})

    record = {
        "host_index": state.host_index,
        "tpu_worker_id": os.environ.get("TPU_WORKER_ID"),
        "ray_world_rank": ray.train.get_context().get_world_rank(),
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "global_devices": xr.global_runtime_device_count(),
        "addressable_devices": xr.addressable_runtime_device_count(),
        "device_type": xr.device_type(),
        "spmd": xr.is_spmd(),
        "mesh_shape": list(mesh.mesh_shape),
        "axis_names": list(mesh.axis_names),
        "is_xla_backend": tpu_backend.is_xla_backend(),
        "process_group": state.process_group_backend,
        "losses": losses,
        "uncached_compile": met.counter_value("UncachedCompile"),
        "cached_compile": met.counter_value("CachedCompile"),
        "first_step_time": t_first,
        "pid": os.getpid(),
    }
    out_dir = config.get("out_dir")
    if out_dir:
        path = Path(out_dir) / f"host{state.host_index}.json"
        path.write_text(json.dumps(record))


def read_records(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-host records :func:`train_loop` wrote, sorted by host index."""
    records = [json.loads(p.read_text()) for p in Path(out_dir).glob("host*.json")]
    return sorted(records, key=lambda r: r["host_index"])


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
) -> tuple[Any, list[dict[str, Any]]]:
    """Train :func:`train_loop` on a connected (simulated) TPU Ray cluster.

    Returns the Ray ``Result`` and the per-host records.  The caller owns the cluster
    (see :func:`xlasim.ray_cluster.simulated_tpu_cluster`).
    """
    # Deferred: Ray is optional (the `ray` extra); the module imports without it.
    from ray.train import RunConfig, ScalingConfig

    spec = parse_slice(topology, accelerator)
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
                num_workers=spec.num_hosts,
            ),
            run_config=RunConfig(
                name=f"xlasim-demo-{spec.pod_type}-{int(time.time())}",
                storage_path=storage_path or os.path.join(tmp, "ray_results"),
            ),
        )
        result = fit_with_deadline(trainer, fit_timeout_s)
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
            str(r["host_index"]),
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
        losses.add_column(f"host {r['host_index']}")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
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
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds before the run is abandoned (default 600)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="forward the Ray workers' logs (per-step lines of every host)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    accelerator = args.accelerator
    if accelerator is None and args.topology == DEFAULT_TOPOLOGY:
        accelerator = DEFAULT_ACCELERATOR
    try:
        spec = parse_slice(args.topology, accelerator)
    except ValueError as e:
        parser.error(str(e))
    console = Console()
    console.print(slice_table(spec))

    t0 = time.monotonic()
    console.print(f"starting a local Ray cluster with {spec.num_hosts} simulated TPU host(s)...")
    # Worker logs stay in the cluster's log files (--verbose shows them): without a
    # dashboard Ray Train's placement-group cleaner warns every second.
    with simulated_tpu_cluster(
        spec.topology, spec.accelerator, log_to_driver=args.verbose
    ) as cluster:
        console.print(
            f"cluster up in {cluster.startup_s:.1f}s; training {args.steps} steps on "
            f"{spec.num_hosts} host(s) (one Ray Train worker per host)..."
        )
        _, records = run(
            spec.topology,
            spec.accelerator,
            steps=args.steps,
            batch=args.batch,
            fit_timeout_s=args.timeout,
        )
    ok = _print_report(spec, records, time.monotonic() - t0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
