"""The ``rnnc`` command: ``dump``, ``bench``, ``demo``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence

from rnnc.errors import RnncError


class _Parser(argparse.ArgumentParser):
    """argparse, with a one-line error message and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def load_cell(spec: str, input_size: int, hidden_size: int):
    """A standard cell name, or ``path/file.py:factory`` called as factory(I, H)."""
    from rnnc.cells import NAMED

    if spec in NAMED:
        return NAMED[spec](input_size, hidden_size)
    path, sep, factory = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise RnncError(f"unknown cell {spec!r}: expected one of {', '.join(sorted(NAMED))} "
                        f"or path/to/file.py:factory")
    if not os.path.isfile(path):
        raise RnncError(f"cell file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location("rnnc_user_cell", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise RnncError(f"{path} has no function {factory!r}")
    return fn(input_size, hidden_size)


def _dump(args: argparse.Namespace) -> int:
    import rnnc
    from rnnc import passes
    from rnnc.dot import to_dot
    from rnnc.ir import retype

    cell = load_cell(args.cell, args.input_size, args.hidden_size)
    modes = ("forward", "backward") if args.mode == "train" else ("inference",)
    for mode in modes:
        if args.format == "text":
            print(rnnc.dump(cell, after=args.after, mode=mode))
        else:
            names = passes.pipeline(mode)
            if args.after != "all":
                if args.after not in names:
                    raise RnncError(f"--after must be a pass of the {mode} pipeline "
                                    f"({', '.join(names)}) or 'all', got {args.after!r}")
                names = names[:names.index(args.after) + 1]
            program = passes.run(retype(cell.program(), "f32"), names)
            sys.stdout.write(to_dot(program, f"{cell.name} {mode}"))
        print()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rnnc.demo import run

    return run(quick=args.quick)


def _bench(args: argparse.Namespace) -> int:
    from rnnc import bench

    return bench.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rnnc", description="rnnc: a compiler for recurrent cells.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    dump = sub.add_parser("dump", help="print a cell's IR after the optimization passes")
    dump.add_argument("cell", help="rnn | rnn_relu | lstm | gru | gru_v3 | mgu | peephole_lstm"
                                   " | path/file.py:factory")
    dump.add_argument("--after", default="all", help="a pass name, or 'all' (default)")
    dump.add_argument("--mode", choices=("inference", "train"), default="inference")
    dump.add_argument("--format", choices=("text", "dot"), default="text")
    dump.add_argument("--input-size", type=int, default=32)
    dump.add_argument("--hidden-size", type=int, default=64)
    dump.set_defaults(func=_dump)

    demo = sub.add_parser("demo", help="define, optimize, check, train and time a custom cell")
    demo.add_argument("--quick", action="store_true", help="smaller sizes (for tests)")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="time rnnc against PyTorch (and JAX) on C1-C4")
    try:
        from rnnc import bench as bench_module

        bench_module.add_arguments(bench)
    except ImportError:
        pass
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("input_size", "hidden_size"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        return args.func(args)
    except RnncError as err:
        sys.stderr.write(f"rnnc {args.command}: error: {err}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
