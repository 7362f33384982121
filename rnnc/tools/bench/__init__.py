"""Time rnnc against its peers in one run: PyTorch (nn.LSTM/nn.GRU, an eager loop) and JAX.

Every row pairs rnnc with one peer on the same configuration, cell, mode, shapes, float32
data and thread count, measured one after the other in the same process; only the ratio
rnnc / peer carries from run to run on a shared, noisy machine. The first calls of each
function (compilation, tracing, oneDNN primitive creation) are a warm-up, never timed with
the others; the first call's time is kept to report compilation.

Library side of ``rnnc bench``; ``python benchmarks/run.py`` calls :func:`main` too. The
parts: ``configs`` (what is measured), ``peers`` (PyTorch and JAX), ``harness`` (timing one
row) and ``report`` (tables, Markdown, JSON, the chart); this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rnnc import process
from rnnc.tools.bench.bf16 import PRECISIONS, bench_bf16
from rnnc.tools.bench.configs import (
    CELLS,
    CONFIGS,
    DEFAULT_CELLS,
    MODES,
    PEERS,
    CellSpec,
    Config,
    gemm_flop,
    layer_params,
    tiny,
)
from rnnc.tools.bench.harness import bench_one, compile_times, rnnc_call, timed
from rnnc.tools.bench.peers import jax_available
from rnnc.tools.bench.report import COLUMNS, format_table, machine_info, to_markdown, write_png
from rnnc.tools.bench.scaling import run_scaling


def _names(value: str, allowed: tuple[str, ...], what: str,
           default: tuple[str, ...] | None = None) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return list(allowed if default is None else default)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or value!r}; choose from "
                                         f"{', '.join(allowed)} or all")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``rnnc bench`` (and of ``benchmarks/run.py``)."""
    configs, cells = tuple(CONFIGS), tuple(CELLS)
    parser.add_argument("--configs", default="all",
                        type=lambda v: _names(v, configs, "configuration"),
                        help=f"comma-separated from {', '.join(configs)} (default all)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="tiny: the same layers and directions at T=5 B=2 I=H=8 (smoke test)")
    parser.add_argument("--cells", default="all",
                        type=lambda v: _names(v, cells, "cell", DEFAULT_CELLS),
                        help=f"comma-separated from {', '.join(cells)} (default all: "
                             f"{', '.join(DEFAULT_CELLS)})")
    parser.add_argument("--modes", default="all", type=lambda v: _names(v, MODES, "mode"),
                        help="inference, training or all (training: forward + backward of "
                             "sum(y))")
    parser.add_argument("--peers", default=None, type=lambda v: _names(v, PEERS, "peer"),
                        help="torch (nn.LSTM/nn.GRU), eager (PyTorch loop), compile (that loop "
                             "with torch.compile of its step), jax (lax.scan+jit);"
                             " default: all, jax only when it imports")
    parser.add_argument("--backend", default="llvm", help="rnnc backend (default llvm)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for rnnc's BLAS and PyTorch (default: available cores)")
    parser.add_argument("--team", action=argparse.BooleanOptionalAction, default=None,
                        help="run rnnc's time loop on a thread team of --threads threads, or "
                             "not (llvm backend; default: on unless RNNC_TEAM=0; "
                             "docs/threads.md)")
    parser.add_argument("--scaling", action="store_true",
                        help="time rnnc and nn.LSTM/nn.GRU at 1, 2, 4, ... threads up to "
                             "--threads (default: available cores) and print the speed-ups")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (>= 5 to report)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (>= 1)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time; cpu: the process's CPU time, all its threads "
                             "(for one thread on a machine busy with other processes)")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip measuring LSTM compile time (cold and cached)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="bf16: also time rnnc with precision='bf16' against nn.LSTM/nn.GRU "
                             ".to(bfloat16) and under torch.autocast, the eager and compile "
                             "loops under torch.autocast, and JAX in bfloat16, in the same "
                             "run as the fp32 rows")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--png", metavar="FILE", help="bar chart of ratios (needs matplotlib)")


def _set_threads(args: argparse.Namespace, peers: list[str], threads: int) -> dict:
    """rnnc's backend options and PyTorch's thread count; prints the threads of each side."""
    options: dict = {} if args.backend == "numpy" else {"threads": threads}
    team = getattr(args, "team", None)
    if team is not None and args.backend == "llvm":
        options["team"] = team
    if team is None:
        team = process.TEAM.value(True)
    on_team = args.backend == "llvm" and team and threads > 1
    used = [f"rnnc {threads if options else 1}" + (" (team)" if on_team else "")]
    if {"torch", "eager", "compile"} & set(peers):
        import torch

        torch.set_num_threads(threads)
        used.append(f"torch {torch.get_num_threads()}")
    print("threads: " + ", ".join(used), flush=True)
    return options


def _scaling(args: argparse.Namespace, configs: list[Config], threads: int) -> int:
    rows = run_scaling(args, configs, threads, _set_threads, bench_one,
                       lambda cell: CELLS[cell].torch_module is not None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scaling": rows, "machine": machine_info(threads, args.backend)}, f,
                      indent=1)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by parsed ``args``; print the table; 0 on success."""
    if args.reps < 1 or args.warmup < 1:
        print("rnnc bench: --reps and --warmup must be at least 1", file=sys.stderr)
        return 2
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("rnnc bench: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    peers = args.peers
    if peers is None:
        peers = [p for p in PEERS if p != "jax" or jax_available()]
    elif "jax" in peers and not jax_available():
        print("rnnc bench: --peers jax but jax does not import (pip install jax)",
              file=sys.stderr)
        return 2
    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count() or 1)
    configs = [CONFIGS[c] for c in args.configs]
    if args.size == "tiny":
        configs = [tiny(c) for c in configs]
    if getattr(args, "scaling", False):
        return _scaling(args, configs, threads)
    options = _set_threads(args, peers, threads)
    rows = []
    for config in configs:
        for cell in args.cells:
            for mode in args.modes:
                new = bench_one(config, cell, mode, peers, args, options)
                if getattr(args, "precision", "fp32") == "bf16":
                    new += bench_bf16(config, cell, mode, peers, args, options)
                for line in format_table(new).splitlines()[2:]:
                    print(line, flush=True)
                rows += new
    compile_s = None
    if not args.no_compile_time:
        compile_s = compile_times(args.backend, options, configs[0].H)
    print()
    print(format_table(rows))
    if compile_s:
        print("\ncompile LSTM forward+backward: " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f} s" for k, v in compile_s.items()))
    command = "rnnc bench " + " ".join(getattr(args, "argv", None) or sys.argv[1:])
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(to_markdown(rows, machine_info(threads, args.backend), command, compile_s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "compile": compile_s,
                       "machine": machine_info(threads, args.backend)}, f, indent=1)
    if args.png:
        write_png(rows, args.png)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` as ``rnnc bench`` would and run."""
    parser = argparse.ArgumentParser(prog="rnnc bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run(args)


__all__ = ["CELLS", "COLUMNS", "CONFIGS", "DEFAULT_CELLS", "MODES", "PEERS", "CellSpec", "Config",
           "add_arguments", "bench_one", "gemm_flop", "layer_params", "main", "rnnc_call", "run",
           "tiny", "timed"]
