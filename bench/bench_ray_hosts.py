"""Simulated TPU slices on one machine's Ray cluster, by number of hosts: bring-up, a short
training run through the TPU backend, teardown, and the memory each host costs.

For each topology (default: v4 2x2x2 ... 4x4x8 = 2, 4, 8, 16, 32 hosts of 4 chips, 8 to 128 chips)
it starts :func:`xlasim.ray.cluster.simulated_tpu_cluster` (one Ray node per host), runs the
demo's training loop (``xlasim.cli.demo.run``: SPMD MLP, one Ray Train worker per host) for a few
steps, and shuts the cluster down.  While the run goes on it samples the memory of every
process the cluster started (this process's descendants), grouped by kind: the Ray Train
workers that hold the simulated hosts, Ray's per-node daemons (raylet and its two agents),
Ray Train's run actors (controller and helpers, one set per run), worker processes Ray has
started but not yet given a task, and the head's daemons.

Memory is PSS (proportional set size): pages shared between processes (torch's and Ray's
shared libraries, mapped once by every worker) count once in total, split among the processes
that map them, so the sum is what the machine really spends; RSS would count them once per
process.  The table gives seconds for each phase and the peak memory per host; a size the
machine's free memory cannot hold (estimated from the previous size) stops the sweep.

    python bench/bench_ray_hosts.py [--sizes 2x2x2,2x2x4] [--accelerator v4] [--steps 3]

Timings vary with machine load (stated in the output); the memory figures do not.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

import psutil
from rich.console import Console
from rich.table import Table

from tpu_backend.topology import parse_slice
from xlasim.cli import demo
from xlasim.ray.cluster import machine_load, simulated_tpu_cluster

DEFAULT_SIZES = "2x2x2,2x2x4,2x4x4,4x4x4,4x4x8"


def process_kind(proc: psutil.Process) -> str:
    """Which part of the cluster a process is (by its command line)."""
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "RayTrainWorker" in cmd:
        return "host worker"
    if name == "raylet" or "/raylet" in cmd or "Agent" in cmd:
        return "node daemons"
    if name == "ray::IDLE" or "default_worker.py" in cmd:
        return "idle workers"
    if name.startswith("ray::"):
        return "run actors"
    return "head daemons"


class MemorySampler:
    """PSS per process kind at the sample with the highest total, over the samples taken (at
    most one per ``interval_s``: reading every process's page map is not free).  The kinds are
    taken at that one moment, so they add up to the total: each kind's own peak comes at a
    different time (a worker counts as idle until Ray hands it its actor)."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.peak: dict[str, int] = {}
        self.peak_total = 0
        self.peak_worker = 0
        self.interval_s = interval_s
        self._last = 0.0

    def sample(self) -> None:
        if time.monotonic() - self._last < self.interval_s:
            return
        self._last = time.monotonic()
        totals: dict[str, int] = defaultdict(int)
        for proc in psutil.Process().children(recursive=True):
            try:
                pss = proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            kind = process_kind(proc)
            if kind == "gone":
                continue
            totals[kind] += pss
            if kind == "host worker":
                self.peak_worker = max(self.peak_worker, pss)
        if sum(totals.values()) > self.peak_total:
            self.peak_total = sum(totals.values())
            self.peak = dict(totals)


def run_size(topology: str, accelerator: str, steps: int, console: Console) -> dict[str, object]:
    spec = parse_slice(topology, accelerator)
    sampler = MemorySampler()
    t0 = time.monotonic()
    with simulated_tpu_cluster(
        spec.topology,
        spec.accelerator,
        startup_timeout_s=60.0 + 15.0 * spec.num_hosts,
        log_to_driver=False,
    ) as cluster:
        up_s = time.monotonic() - t0
        t1 = time.monotonic()
        _, records = demo.run(
            spec.topology,
            spec.accelerator,
            steps=steps,
            fit_timeout_s=300.0 + 30.0 * spec.num_hosts,
            watch=lambda _out: sampler.sample(),
        )
        fit_s = time.monotonic() - t1
        t2 = time.monotonic()
        assert cluster.num_hosts == spec.num_hosts
    down_s = time.monotonic() - t2
    if len(records) != spec.num_hosts:
        raise RuntimeError(f"{len(records)} of {spec.num_hosts} hosts wrote their record")
    losses = {tuple(r["losses"]) for r in records}
    console.print(
        f"{spec.pod_type} {spec.topology}: {spec.num_hosts} hosts, {spec.num_devices} chips: "
        f"up {up_s:.1f}s, fit {fit_s:.1f}s, down {down_s:.1f}s; "
        f"hosts agree on the losses: {len(losses) == 1}; {machine_load()}"
    )
    return {
        "spec": spec,
        "up_s": up_s,
        "fit_s": fit_s,
        "down_s": down_s,
        "peak_total": sampler.peak_total,
        "peak_worker": sampler.peak_worker,
        "by_kind": dict(sampler.peak),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated topologies")
    parser.add_argument("--accelerator", default="v4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=3.0,
        help="stop the sweep when the next size's estimated memory would leave less free",
    )
    args = parser.parse_args()
    console = Console(width=160)
    console.print(f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM")
    rows = []
    per_host_estimate = 0.0
    for topology in args.sizes.split(","):
        spec = parse_slice(topology, args.accelerator)
        need = per_host_estimate * spec.num_hosts
        free = psutil.virtual_memory().available
        if need and need > free - args.reserve_gib * 2**30:
            console.print(
                f"stopping before {topology} ({spec.num_hosts} hosts): about "
                f"{need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB available"
            )
            break
        row = run_size(topology, args.accelerator, args.steps, console)
        rows.append(row)
        per_host_estimate = row["peak_total"] / spec.num_hosts  # type: ignore[operator]

    table = Table(title="simulated slice on a local Ray cluster (PSS at the peak of the total)")
    for col in ("slice", "hosts", "up s", "fit s", "down s", "MiB/host", "worker MiB"):
        table.add_column(col, justify="right")
    kinds = sorted({k for r in rows for k in r["by_kind"]})  # type: ignore[attr-defined]
    for kind in kinds:
        table.add_column(f"{kind} MiB/h", justify="right")
    table.add_column("total GiB", justify="right")
    for r in rows:
        spec = r["spec"]
        n = spec.num_hosts  # type: ignore[attr-defined]
        table.add_row(
            f"{spec.pod_type} {spec.topology}",  # type: ignore[attr-defined]
            str(n),
            f"{r['up_s']:.1f}",
            f"{r['fit_s']:.1f}",
            f"{r['down_s']:.1f}",
            f"{r['peak_total'] / n / 2**20:.0f}",  # type: ignore[operator]
            f"{r['peak_worker'] / 2**20:.0f}",  # type: ignore[operator]
            *(f"{r['by_kind'].get(k, 0) / n / 2**20:.0f}" for k in kinds),  # type: ignore[attr-defined]
            f"{r['peak_total'] / 2**30:.1f}",  # type: ignore[operator]
        )
    console.print(table)


if __name__ == "__main__":
    main()
