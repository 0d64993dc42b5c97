"""The ``xlasim`` command: ``run`` a program against a simulated slice, ``describe`` a slice,
``demo`` a training run through the Ray Train backend, ``ray-node`` some hosts of a slice as
nodes of an existing Ray cluster."""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from collections.abc import Sequence
from typing import Any

from tpu_backend.topology import (
    DEFAULT_ACCELERATOR,
    STANDARD_TOPOLOGIES,
    check_slice_index,
    megascale_env,
    normalize_accelerator,
    parse_slice,
    tpu_host_env,
)
from xlasim._activation import NUM_SLICES_ENV, SINGLE_PROCESS_ENV, SLICE_INDEX_ENV
from xlasim.arguments import OneLineErrorParser, fail, positive_int, reject_dash_topologies
from xlasim.cli.launcher import HOSTS_ADDR_ENV, LOCAL_HOSTS_TIMEOUT_S, run_hosts
from xlasim.runtime.ports import loopback_address
from xlasim.runtime.settings import (
    COMPILER_ENV,
    COMPILERS,
    DRY_RUN_ENV,
    HOSTS_TIMEOUT_ENV,
    REPORT_ENV,
    check_runtime_knobs,
    resolve_compiler,
)


def _pth_installed() -> bool:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return any(os.path.exists(os.path.join(p, "xlasim.pth")) for p in paths)


def simulation_env(
    topology: str,
    accelerator: str | None,
    host_index: int = 0,
    *,
    compiler: str | None = None,
    dry_run: bool = False,
    num_slices: int = 1,
    slice_index: int = 0,
) -> dict[str, str]:
    """The variables that make a Python process start against the simulated slice (host
    ``host_index`` of slice ``slice_index`` of ``num_slices``)."""
    spec = parse_slice(topology, accelerator)
    # Validates the host index with the same message the runtime would give.
    tpu_host_env(spec, host_index)
    env = {
        "XLASIM_TOPOLOGY": spec.topology,
        "XLASIM_ACCELERATOR": spec.accelerator,
        "XLASIM_HOST_INDEX": str(host_index),
    }
    if num_slices > 1:
        env[NUM_SLICES_ENV] = str(num_slices)
        env[SLICE_INDEX_ENV] = str(slice_index)
        # What the job's hosts get from Ray or GKE, there before the program starts.
        env.update(megascale_env(num_slices, slice_index))
    if compiler is not None:
        # Checked here, before the program starts: an unknown name or a missing extra.
        name = resolve_compiler(compiler) or "none"
        env[COMPILER_ENV] = name
        if name != "none":
            env[REPORT_ENV] = "1"  # compile progress, and the compiled-graph table at exit
    if dry_run:
        env[DRY_RUN_ENV] = "1"
    return env


# Above this many hosts, starting one process each is worth a word: each holds its own torch.
_MANY_HOSTS = 8


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        fail("xlasim run", "no command given; usage: xlasim run --topology T -- CMD ...")
    spec = parse_slice(args.topology, args.accelerator)
    num_slices = args.num_slices
    for option, value in (("--host-index", args.host_index), ("--slice-index", args.slice_index)):
        if args.single_process and value is not None:
            fail("xlasim run", f"--single-process and {option} exclude each other")
    if args.slice_index is not None:
        check_slice_index(args.slice_index, num_slices)
    # By default every slice's every host: one process each, as `--worker=all` starts on each
    # slice of a multislice job; (slice, host) pairs in process order.
    slices = range(num_slices) if args.slice_index is None else [args.slice_index]
    hosts = range(spec.num_hosts) if args.host_index is None else [args.host_index]
    if args.single_process:
        indexes = [(0, 0)]
    else:
        indexes = [(s, h) for s in slices for h in hosts]
        if len(indexes) > _MANY_HOSTS:
            of = f"{num_slices} x {spec.pod_type}" if num_slices > 1 else spec.pod_type
            print(
                f"xlasim run: starting {len(indexes)} host processes, one per host of "
                f"{of} (each loads torch); --single-process runs one for them all",
                file=sys.stderr,
            )
    envs = [
        dict(
            os.environ,
            **simulation_env(
                args.topology,
                args.accelerator,
                h,
                compiler=args.compiler,
                dry_run=args.dry_run,
                num_slices=num_slices,
                slice_index=s,
            ),
        )
        for s, h in indexes
    ]
    check_runtime_knobs(envs[0])  # a bad knob fails here, not in the children at first use
    pjrt_device = (os.environ.get("PJRT_DEVICE") or "").strip()
    if pjrt_device and pjrt_device != "TPU":
        # Honoured, as on a TPU VM (pytorch/xla's CPU CI sets it per file), but easy to have
        # left set in a shell: say what it does to the simulated hosts.
        print(
            f"xlasim run: PJRT_DEVICE={pjrt_device}: torch_xla in each host process uses that "
            "PJRT client, as on a TPU VM, not the simulated TPU; unset PJRT_DEVICE for the TPU",
            file=sys.stderr,
        )
    if args.single_process:
        envs[0][SINGLE_PROCESS_ENV] = "1"
    if len(indexes) > 1:
        addr = os.environ.get(HOSTS_ADDR_ENV) or loopback_address()
        for env in envs:
            env[HOSTS_ADDR_ENV] = addr
            # Hosts started together on one machine meet within seconds: a host that does not
            # come within a minute has failed to start, and the others say so then.
            env.setdefault(HOSTS_TIMEOUT_ENV, f"{LOCAL_HOSTS_TIMEOUT_S:g}")
    if not _pth_installed():
        fail(
            "xlasim run",
            "xlasim.pth is not installed in this environment's site-packages, so child "
            "processes cannot activate the simulator; install the package "
            "(`pip install -e .` or `pip install xlasim`)",
        )
    try:
        return run_hosts(command, envs, echo_all=args.all_output)
    except FileNotFoundError:
        fail("xlasim run", f"command not found: {command[0]!r}")
    except PermissionError:
        hint = " (a Python script runs as `-- python SCRIPT`)" if command[0].endswith(".py") else ""
        fail("xlasim run", f"{command[0]!r} is not executable{hint}")


# A slice can have thousands of hosts: the table shows the first and last few, and a list with
# one entry per host is cut, so the output stays a screenful whatever the slice.
_HOSTS_SHOWN = 4
_LIST_ITEMS_SHOWN = 4


def _shown_hosts(num_hosts: int) -> list[int]:
    if num_hosts <= 2 * _HOSTS_SHOWN:
        return list(range(num_hosts))
    return [*range(_HOSTS_SHOWN), *range(num_hosts - 2, num_hosts)]


def _abbreviated(value: str) -> str:
    items = value.split(",")
    if len(items) <= _LIST_ITEMS_SHOWN:
        return value
    return ",".join(items[:_LIST_ITEMS_SHOWN]) + f",... ({len(items)} in all)"


def _cmd_describe(args: argparse.Namespace) -> int:
    # Deferred: only `describe` prints tables, so `xlasim run` starts without importing rich.
    from rich.console import Console
    from rich.table import Table

    from xlasim.cli.describe import MAX_GRID_CHIPS, chip_grids, multislice_mesh, slice_table

    if args.list_generation is not None:
        if args.topology is not None or args.accelerator is not None:
            raise ValueError("--list GENERATION takes no topology or --accelerator")
        return _list_generation(args.list_generation, Console())
    if args.topology is None:
        raise ValueError("give a topology (e.g. 2x2x2 --accelerator v4) or --list GENERATION")
    spec = parse_slice(args.topology, args.accelerator)
    num_slices = args.num_slices
    console = Console()
    console.print(slice_table(spec, num_slices))
    total_chips = spec.num_chips * num_slices
    if total_chips <= MAX_GRID_CHIPS:
        for grid in chip_grids(spec, num_slices):
            console.print(grid)
    else:
        console.print(f"({total_chips} chips: more than the {MAX_GRID_CHIPS} a grid shows)")

    shape, axes = multislice_mesh(spec, num_slices)
    hosts = Table(title="Per-host TPU environment")
    hosts.add_column("host" if num_slices == 1 else "slice, host")
    hosts.add_column("devices (global ids)")
    hosts.add_column("TPU env")
    shown = _shown_hosts(spec.num_hosts * num_slices)
    for i, process in enumerate(shown):
        if i and process != shown[i - 1] + 1:
            hosts.add_row("...", f"({process - shown[i - 1] - 1} more hosts)", "")
        slice_index, host = divmod(process, spec.num_hosts)
        first = process * spec.devices_per_host
        env = tpu_host_env(spec, host) | megascale_env(num_slices, slice_index)
        hosts.add_row(
            str(host) if num_slices == 1 else f"{slice_index}, {host}",
            f"{first}..{first + spec.devices_per_host - 1}",
            "\n".join(f"{k}={_abbreviated(v)}" for k, v in env.items()),
        )
    console.print(hosts)
    console.print(f"default SPMD mesh: shape {shape}, axes {axes}")
    return 0


def _list_generation(generation: str, console: Any) -> int:
    """The standard slices of one generation, smallest first, one row each."""
    from rich.table import Table  # deferred with the rest of describe's output

    name = normalize_accelerator(generation)
    table = Table(title=f"standard {name} slices")
    for column in ("topology", "pod type", "chips", "hosts", "chips per host"):
        table.add_column(column, justify="left" if column in ("topology", "pod type") else "right")
    for topology in STANDARD_TOPOLOGIES[name]:
        spec = parse_slice(topology, name)
        table.add_row(
            topology,
            spec.pod_type,
            str(spec.num_chips),
            str(spec.num_hosts),
            str(spec.chips_per_host),
        )
    console.print(table)
    return 0


def _cmd_demo(args: argparse.Namespace, rest: Sequence[str]) -> int:
    # Deferred: the demo needs Ray (the optional `ray` extra).
    from xlasim.cli import demo

    return int(demo.main(list(rest)) or 0)


def _cmd_ray_node(rest: Sequence[str]) -> int:
    # Deferred: Ray nodes need Ray (the optional `ray` extra).
    from xlasim.ray import node as ray_node

    return ray_node.main(list(rest))


def _parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="xlasim", description="Run torch_xla programs against a simulated TPU slice."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run a command against a simulated slice")
    run.add_argument("--topology", required=True, help="chip grid, e.g. 2x2 or 2x2x2")
    run.add_argument(
        "--accelerator", default=None, help=f"TPU generation (default {DEFAULT_ACCELERATOR})"
    )
    run.add_argument(
        "--host-index",
        type=int,
        default=None,
        help="run only this host (default: every host of the slice, one process each)",
    )
    run.add_argument(
        "--num-slices",
        type=positive_int,
        default=1,
        help="slices of the topology joined over DCN, a multislice job (default 1)",
    )
    run.add_argument(
        "--slice-index",
        type=int,
        default=None,
        help="run only this slice's hosts (default: every slice)",
    )
    run.add_argument(
        "--single-process",
        action="store_true",
        help="one process stands for every host (host 0; the others enter the same data)",
    )
    run.add_argument(
        "--all-output",
        action="store_true",
        help="print every host's output, each line prefixed [host N] (default: host 0's only)",
    )
    run.add_argument(
        "--compiler",
        default=None,
        help=f"also compile every graph with a real compiler for the slice: "
        f"{', '.join(COMPILERS)} (needs the tpu-compiler extra), or none",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="run on shapes only: no values are computed, so models of any size fit",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    describe = sub.add_parser(
        "describe", help="print a slice as a table, or list a generation's slices (--list v4)"
    )
    describe.add_argument("topology", nargs="?")
    describe.add_argument("--accelerator", default=None)
    describe.add_argument(
        "--num-slices",
        type=positive_int,
        default=1,
        help="slices of the topology joined over DCN, a multislice job (default 1)",
    )
    describe.add_argument(
        "--list",
        metavar="GENERATION",
        dest="list_generation",
        help="list the standard slices of a TPU generation (e.g. v4, v5p, v6e) and stop",
    )

    sub.add_parser("demo", help="train a small model through the Ray Train backend", add_help=False)
    sub.add_parser(
        "ray-node",
        help="start some hosts of a simulated slice as nodes of an existing Ray cluster",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        return _cmd_demo(argparse.Namespace(), argv[1:])
    if argv[:1] == ["ray-node"]:
        return _cmd_ray_node(argv[1:])
    parser = _parser()
    reject_dash_topologies(parser, argv)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "run":
            return _cmd_run(args)
        return _cmd_describe(args)
    except (ValueError, ImportError) as exc:
        print(f"xlasim {args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
