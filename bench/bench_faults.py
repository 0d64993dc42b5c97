"""How long each fault of a simulated v4-16 slice (2 hosts) under Ray Train takes to be noticed.

Runs every drill of ``tests/fault_drills.py`` once on one fake-TPU Ray cluster and prints
fault -> outcome -> seconds -> the bound that applies:

* ``peer error s``: from the fault to the first error on another host (how long a surviving
  host was kept waiting);
* ``detection s``: from the fault to ``fit()`` raising (error) or to the retry's hosts
  starting again (recovered; ``FailureConfig(max_failures=1)``).

The hanging hosts run with both bounds lowered to ``--hang-bound-s`` (the defaults are
``XLASIM_HOSTS_TIMEOUT_S=300`` and ``TPUTorchConfig(timeout_s=1800)``).  Times include the
machine's load; the tests (tests/test_ray_faults.py) assert the outcomes, not the times.

    python bench/bench_faults.py [--hang-bound-s 20] [--fault kill --fault raise ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fault_drills import FAULTS, leftovers, print_table, run_drill  # noqa: E402

from xlasim.ray.cluster import machine_load, simulated_tpu_cluster  # noqa: E402


def bounds(hang_s: int) -> dict[str, str]:
    return {
        "kill": "Ray: worker death seen at once; peers: connection closed",
        "raise": "none needed: the error ends the run",
        "hang_exchange": f"XLASIM_HOSTS_TIMEOUT_S={hang_s} s (default 300)",
        "hang_all_reduce": f"TPUTorchConfig(timeout_s={hang_s}) (default 1800)",
        "kill_coordinator": "Ray: worker death seen at once; peers: connection closed",
        "kill_in_save": "as kill; the half-written checkpoint is not registered",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-bound-s", type=int, default=20)
    parser.add_argument("--fault", action="append", choices=FAULTS)
    args = parser.parse_args()
    faults = args.fault or list(FAULTS)
    results = []
    with simulated_tpu_cluster(
        "2x2x2",
        "v4",
        startup_timeout_s=180,
        driver_log_level=logging.WARNING,
        log_to_driver=False,  # the workers' tracebacks would bury the table
    ) as cluster:
        print(f"cluster up in {cluster.startup_s:.1f}s ({machine_load()})", flush=True)
        for fault in faults:
            recover = fault in ("kill", "kill_coordinator", "kill_in_save")
            with tempfile.TemporaryDirectory(prefix=f"bench-{fault}-") as work:
                result, _ = run_drill(
                    fault,
                    Path(work),
                    max_failures=1 if recover else 0,
                    timeout_s=args.hang_bound_s if fault == "hang_all_reduce" else 1800,
                    hosts_timeout_s=args.hang_bound_s if fault == "hang_exchange" else None,
                )
                left = leftovers(Path(work) / "out")
            print(
                f"{fault}: {result.outcome}, resumed from "
                f"{[a['resumed_from'] for a in result.attempts]}, fault: {result.fault_record}, "
                f"left behind: {left or 'nothing'}",
                flush=True,
            )
            results.append(result)
    print(f"\n({machine_load()})")
    print_table(results, bounds(args.hang_bound_s))


if __name__ == "__main__":
    main()
