"""Bring-up time and memory of simulated TPU hosts spread over several `xlasim ray-node`s.

For each (machines, hosts) of the sweep: a fresh head (``ray start --head``), then ``machines``
``xlasim ray-node`` commands started at once (as separate machines would be), each hosting a
contiguous share of the slice's hosts.  Printed per row: the wall time until every machine
reports its hosts joined, and the resident memory (RSS) of each machine's process tree (the
command, its ``ray start`` processes, raylets and Ray's per-node agents), idle, before any job.

All machines are this one, so the times include their competition for its cores: a row with
more machines per box is slower here than on as many real machines.

    python bench/bench_ray_nodes.py [--machines 1,2,3] [--hosts 2,4,8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from xlasim.ray import node as ray_node

# hosts -> a slice with that many hosts of 4 chips
SLICES = {2: ("2x2x2", "v4"), 4: ("4x4", "v6e"), 8: ("4x8", "v6e"), 16: ("8x8", "v6e")}
BRING_UP_BOUND_S = 900.0
STOP_BOUND_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shares(hosts: int, machines: int) -> list[str]:
    """'0-2', '3-5', '6-7': contiguous ranges, as even as they go."""
    bounds = [hosts * i // machines for i in range(machines + 1)]
    return [f"{lo}-{hi - 1}" for lo, hi in zip(bounds, bounds[1:], strict=False)]


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def _kill_node_groups(log: Path) -> None:
    # The `ray start` processes run in their own process groups (pids in the command's output).
    for line in log.read_text(errors="replace").splitlines():
        if " joined (pid " in line:
            pid = int(line.split(" joined (pid ", 1)[1].split(",", 1)[0])
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def measure(machines: int, hosts: int) -> dict[str, object]:
    topology, accelerator = SLICES[hosts]
    temp_dir = Path(tempfile.mkdtemp(prefix="xrb-"))  # short: Ray socket paths have a limit
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "RAY_"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    port = _free_port()
    head = ray_node.start_node(
        "head", ray_node.head_command(port, temp_dir), env, temp_dir / "head.log", timeout_s=300
    )
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        t0 = time.monotonic()
        hosts_port = str(_free_port())
        for i, share in enumerate(_shares(hosts, machines)):
            log = temp_dir / f"machine{i}.log"
            with log.open("wb") as out:
                cmd = [
                    sys.executable, "-m", "xlasim", "ray-node",
                    "--topology", topology, "--accelerator", accelerator, "--hosts", share,
                    "--address", f"127.0.0.1:{port}", "--hosts-port", hosts_port,
                    "--log-dir", str(temp_dir / f"nodes{i}"),
                    "--startup-timeout-s", str(BRING_UP_BOUND_S),
                    f"--temp-dir={temp_dir}", "--disable-usage-stats",
                ]  # fmt: skip
                procs.append(
                    (
                        subprocess.Popen(
                            cmd,
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        ),  # fmt: skip
                        log,
                    )
                )
        pending = list(procs)
        while pending:
            if time.monotonic() - t0 > BRING_UP_BOUND_S:
                raise TimeoutError(f"machines did not come up within {BRING_UP_BOUND_S:g}s")
            for proc, log in list(pending):
                if "are Ray nodes of" in log.read_text(errors="replace"):
                    pending.remove((proc, log))
                elif proc.poll() is not None:
                    raise RuntimeError(f"a machine failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        bring_up = time.monotonic() - t0
        time.sleep(3)  # let agents finish starting before measuring memory
        rss = [_tree_rss(proc.pid) for proc, _ in procs]
        return {
            "machines": machines,
            "hosts": hosts,
            "slice": f"{accelerator} {topology}",
            "bring_up_s": bring_up,
            "machine_rss_mib": [r / 2**20 for r in rss],
            "host_rss_mib": sum(rss) / hosts / 2**20,
            "head_rss_mib": _tree_rss(head.pid) / 2**20,
        }
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _kill_node_groups(log)
        ray_node.stop_nodes([head], grace_s=0)
        shutil.rmtree(temp_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", default="1,2,3")
    parser.add_argument("--hosts", default="2,4,8")
    args = parser.parse_args()
    rows = []
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    print(
        f"{'machines':>8} {'hosts':>5} {'slice':>10} {'bring-up s':>10} "
        f"{'RSS per machine MiB':>28} {'per host MiB':>12} {'head MiB':>8}"
    )
    for hosts in (int(h) for h in args.hosts.split(",")):
        for machines in (int(m) for m in args.machines.split(",")):
            if machines > hosts:
                continue
            try:
                r = measure(machines, hosts)
            except (RuntimeError, TimeoutError) as exc:
                print(f"{machines:>8} {hosts:>5} failed: {str(exc).splitlines()[-1]}", flush=True)
                continue
            rows.append(r)
            per_machine = " ".join(f"{m:.0f}" for m in r["machine_rss_mib"])  # type: ignore[attr-defined]
            print(
                f"{machines:>8} {hosts:>5} {r['slice']:>10} {r['bring_up_s']:>10.1f} "
                f"{per_machine:>28} {r['host_rss_mib']:>12.0f} {r['head_rss_mib']:>8.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
