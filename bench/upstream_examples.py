"""Run pytorch/xla's ``examples/`` programs unchanged on real torch_xla (CPU) and on xlasim.

Each program runs from a copy of the examples dir (their imports expect it: ``sys.argv[0]``'s
parent's parent goes on ``sys.path``), with the small flags it accepts (only
``train_decoder_only_base.py`` takes any; the others run at their built-in size and are judged
by their first logged steps within the time bound):

  real: PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 REAL_PY PROGRAM ARGS
  sim:  SIM_PY -m xlasim run --topology 2x2x1 --accelerator v4 -- SIM_PY PROGRAM ARGS

The table gives, per program and side: finished / logged N steps before the bound / failed, the
first logged losses, and the error line (the exception that ended the run).

    python bench/upstream_examples.py /path/to/xla/examples --sim-python PY [--real-python PY]
        [--only NAME ...] [--timeout 600] [--jobs 1] [--nice 10] [--mem-gb 8] [--json out.json]

The ResNet programs need ``torchvision`` (and Pillow, which it imports) importable by both
interpreters (give it through ``--real-env``/``--sim-env PYTHONPATH=...`` when a venv lacks it),
e.g. with torch 2.9 + torch_xla 2.9 in one venv, which also runs the simulator:

    pip install --target TV --no-deps torchvision==0.24.0 pillow
    python bench/upstream_examples.py EXAMPLES --sim-python VENV/bin/python \
        --real-python VENV/bin/python --sim-env PYTHONPATH=CHECKOUT:TV --real-env PYTHONPATH=TV

The ResNet-50 programs (batch 128 at 224x224) and the decoders at their built-in size
(intermediate size 32768) are TPU-sized: a step needs more than the default 8 GiB cap on either
side, so on a small machine they end with the allocator's error before their first logged step.
On a bigger machine, ``--stop-after-steps 1`` ends each once it has logged its first step (they
log every 10 steps of 200-300). On 16 cores and 128 GB, with ``--mem-gb 48`` and
``OMP_NUM_THREADS`` split between the runs, every single-process program but the SPMD ones takes
a few minutes at most; the multi-process ones (four processes of batch 128 each) and the SPMD ones
(one process holds the global batch of all simulated chips: 512 images, 64 sequences) want the
machine to themselves (``--jobs 1``, ``--mem-gb 115``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# this folder's helper module (the script's own dir is on sys.path)
from _upstream_run import (
    STOPPED,
    add_side_options,
    check_side_options,
    run_bounded,
    side_command,
)

_SMALL_DECODER = [
    "--num-steps", "21", "--hidden-size", "64", "--num-layers", "2", "--num-attention-heads", "4",
    "--num-key-value-heads", "2", "--intermediate-size", "128",
]  # fmt: skip

# name -> program (relative to examples/) and its arguments
PROGRAMS: dict[str, tuple[str, list[str]]] = {
    "resnet_base": ("train_resnet_base.py", []),
    "resnet_amp": ("train_resnet_amp.py", []),
    "resnet_ddp": ("data_parallel/train_resnet_ddp.py", []),
    "resnet_spmd_dp": ("data_parallel/train_resnet_spmd_data_parallel.py", []),
    "resnet_xla_ddp": ("data_parallel/train_resnet_xla_ddp.py", []),
    "resnet_profile": ("debug/train_resnet_profile.py", []),
    "resnet_benchmark": ("debug/train_resnet_benchmark.py", []),
    "resnet_fsdp": ("fsdp/train_resnet_fsdp_auto_wrap.py", []),
    "decoder_base": ("train_decoder_only_base.py", _SMALL_DECODER),
    "decoder_scan": (
        "train_decoder_only_base.py",
        ["scan.decoder_with_scan.DecoderWithScan", *_SMALL_DECODER],
    ),
    "decoder_fsdp_v2": ("fsdp/train_decoder_only_fsdp_v2.py", []),
    "decoder_flash": ("flash_attention/train_decoder_only_flash_attention.py", []),
    "decoder_flash_fsdp_v2": ("flash_attention/train_decoder_only_flash_attention_fsdp_v2.py", []),
    "decoder_eager": ("eager/train_decoder_only_eager.py", []),
    "decoder_eager_mp": ("eager/train_decoder_only_eager_multi_process.py", []),
    "decoder_eager_spmd_dp": ("eager/train_decoder_only_eager_spmd_data_parallel.py", []),
    "decoder_eager_compile": ("eager/train_decoder_only_eager_with_compile.py", []),
    "scan_examples": ("scan/scan_examples.py", []),
}

_STEP = re.compile(r"\bstep: (\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss: (?:tensor\()?([-+0-9.eE]+|nan|inf)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b")


def _is_fatal(line: str) -> bool:
    """XLA's fatal log lines and C++ aborts, which end a run without a Python traceback."""
    return " F external/" in line or "Check failed" in line or line.startswith("terminate called")


@dataclass
class Outcome:
    status: str  # finished / stopped after N logged steps / failed / time bound
    steps_logged: int
    losses: list[str]
    error: str


def logged_steps(output: str) -> set[int]:
    """The step numbers a program's log lines report (``step: N``)."""
    return {int(m.group(1)) for ln in output.splitlines() if (m := _STEP.search(ln))}


def parse_output(output: str, rc: int | None, timeout: float) -> Outcome:
    lines = output.splitlines()
    steps = logged_steps(output)
    losses = [m.group(1) for ln in lines if (m := _LOSS.search(ln))][:5]
    raised, fallback = "", ""
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            # the exception line is the first unindented line after the frames
            after = [ln for ln in lines[i + 1 :] if ln.strip() and not ln[0].isspace()]
            raised = after[0].strip() if after else raised
        elif _is_fatal(line) or (not fallback and _EXCEPTION.match(line.strip())):
            fallback = line.strip()
    error = raised or fallback  # a Python exception explains a later abort, not the reverse
    if rc == 0:
        status = "finished"
    elif rc == STOPPED:
        status = f"stopped after {len(steps)} logged steps"
    elif rc is None:
        status = f"time bound {timeout:g}s" + (f" after {len(steps)} logged steps" if steps else "")
    else:
        status = f"failed rc={rc}" + (f" after {len(steps)} logged steps" if steps else "")
    return Outcome(status, len(steps), losses, error[:300])


# What a program expects the machine to have before it starts (it asserts the folder exists).
SETUP_DIRS = {"resnet_profile": "/tmp/profile"}


def run_program(name: str, side: str, args) -> Outcome:
    program, prog_args = PROGRAMS[name]
    if name in SETUP_DIRS:
        os.makedirs(SETUP_DIRS[name], exist_ok=True)
    cmd, env = side_command(side, args, [program, *prog_args])
    log = args.out_dir / f"{side}_{name}.log"
    rc = run_bounded(
        cmd,
        env=env,
        cwd=args.work_dir,
        log=log,
        timeout=args.timeout,
        nice=args.nice,
        mem_gb=args.mem_gb,
        stop_when=(lambda out: len(logged_steps(out)) >= args.stop_after_steps)
        if args.stop_after_steps
        else None,
    )
    return parse_output(log.read_text(errors="replace"), rc, args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples_dir", type=Path, help="pytorch/xla's examples/ (not modified)")
    parser.add_argument("--sim-python", required=True, help="interpreter with xlasim installed")
    parser.add_argument("--real-python", help="interpreter with real torch_xla (omit: sim only)")
    parser.add_argument("--only", nargs="+", choices=sorted(PROGRAMS), help="programs to run")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per program and side")
    parser.add_argument("--jobs", type=int, default=1, help="programs run at once (default 1)")
    parser.add_argument(
        "--stop-after-steps",
        type=int,
        metavar="N",
        help="end a program once it has logged N steps (what 'runs through its first logged "
        "steps' needs of a TPU-sized program; default: run to the end or the time bound)",
    )
    add_side_options(parser)
    parser.add_argument(
        "--mem-gb", type=float, default=8, help="data-segment cap per process (default 8 GiB)"
    )
    parser.add_argument("--out-dir", type=Path, help="logs and the examples copy (default: tmp)")
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    args = parser.parse_args(argv)
    if not (args.examples_dir / "train_resnet_base.py").is_file():
        parser.error(f"{str(args.examples_dir)!r} has no train_resnet_base.py: not examples/")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be >= 1")
    if args.stop_after_steps is not None and args.stop_after_steps < 1:
        parser.error(f"--stop-after-steps {args.stop_after_steps}: must be >= 1")
    check_side_options(parser, args)
    args.out_dir = (args.out_dir or Path(tempfile.mkdtemp(prefix="upstream_examples_"))).resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # The programs write next to themselves (__pycache__); run a copy, never the source.
    args.work_dir = args.out_dir / "examples"
    shutil.rmtree(args.work_dir, ignore_errors=True)
    shutil.copytree(args.examples_dir, args.work_dir, symlinks=True)  # docs links dangle
    print(f"logs: {args.out_dir}", file=sys.stderr)

    names = args.only or list(PROGRAMS)
    sides = ["sim"] + (["real"] if args.real_python else [])
    results: dict[str, dict[str, Outcome]] = {n: {} for n in names}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_program, n, s, args): (n, s) for n in names for s in sides}
        for fut in concurrent.futures.as_completed(futures):
            name, side = futures[fut]
            results[name][side] = out = fut.result()
            print(f"  {side:4} {name}: {out.status} {out.error}", file=sys.stderr, flush=True)

    for name in names:
        program, prog_args = PROGRAMS[name]
        print(f"{name}: python {program} {' '.join(prog_args)}")
        for side in sides:
            o = results[name][side]
            print(f"  {side:4}: {o.status}; losses {o.losses}; {o.error}")
    finished = sum(results[n]["sim"].status == "finished" for n in names)
    stepped = sum(results[n]["sim"].steps_logged > 0 for n in names)
    print(f"sim: {finished} of {len(names)} finished, {stepped} logged at least one step")
    if args.json:
        data = {n: {s: asdict(o) for s, o in r.items()} for n, r in results.items()}
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
