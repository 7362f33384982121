"""The ``rnnc`` command: ``dump``, ``bench``, ``demo``."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rnnc.errors import RnncError

# Sizes of `rnnc dump` when --input-size / --hidden-size are not given.
DEFAULT_SIZES = (32, 64)


class _Parser(argparse.ArgumentParser):
    """argparse, with a one-line error message and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def parse_arg(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--arg``: VALUE is a Python literal, or a bare word taken as text."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME a Python identifier, "
                                         f"got {text!r}")
    try:
        return name, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    if value.strip().isidentifier():  # --arg act=tanh: the string "tanh"
        return name, value.strip()
    raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a Python literal (a number, "
                                     f"True/False/None, a quoted string, a tuple, list or dict)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _where(err: BaseException, path: str) -> str:
    """`` at FILE:LINE``: the innermost frame of ``err`` inside the user's file, if any."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f" at {path}:{frames[-1].lineno}" if frames else ""


def _load_factory(spec: str) -> tuple[Callable[..., Any], str, str | None]:
    """The factory named by ``spec``, its display name, and the file it came from."""
    from rnnc.cells import NAMED, PUBLISHED

    known = {**NAMED, **PUBLISHED}
    if spec in known:
        return known[spec], f"rnnc.cells.{spec}", None
    path, sep, factory = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise RnncError(f"unknown cell {spec!r}: expected one of {', '.join(sorted(known))} "
                        f"or path/to/file.py:factory")
    if not os.path.isfile(path):
        raise RnncError(f"cell file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location("rnnc_user_cell", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except RnncError:
        raise
    except SyntaxError as err:
        where = path if os.path.abspath(err.filename or "") == os.path.abspath(path) \
            else err.filename
        raise RnncError(f"{where}:{err.lineno}: SyntaxError: {err.msg}") from err
    except Exception as err:  # the user's module: report its error, not rnnc's traceback
        raise RnncError(f"running {path} raised {type(err).__name__}{_where(err, path)}: "
                        f"{err}") from err
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise RnncError(f"{path} has no function {factory!r}")
    return fn, factory, path


def _size_parameters(signature: inspect.Signature | None, named: dict[str, Any]
                     ) -> list[str] | None:
    """Where the sizes go: the names of the two parameters that take them by keyword, None to
    pass them positionally (the usual first two), or [] when the factory takes no sizes."""
    if signature is None:
        return None
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    free = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in named]
    if len(free) < 2:
        return []
    if free[:2] == params[:2]:
        return None
    return [p.name for p in free[:2]]


def _plain(signature: inspect.Signature | None) -> str:
    """``(a, b=2)``: a signature without annotations, as a user reads it in an error."""
    if signature is None:
        return "(...)"
    empty = inspect.Parameter.empty
    return str(signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty))


def call_factory(fn: Callable[..., Any], label: str, sizes: tuple[int, int] | None,
                 named: dict[str, Any], path: str | None = None):
    """``fn(input_size, hidden_size, **named)``, checked: a clean error for a bad call, an
    exception inside the factory, or a result that is not a Cell.

    The sizes go to the first two positional parameters that ``named`` leaves free; a factory
    with fewer such parameters is called with ``named`` alone (then ``sizes`` must be None:
    not given by the user).
    """
    from rnnc.dsl import Cell

    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    targets = _size_parameters(signature, named)
    given = sizes if sizes is not None else DEFAULT_SIZES
    args: tuple[int, ...] = ()
    kwargs = dict(named)
    if targets is None:
        args = given
    elif targets:
        kwargs.update(zip(targets, given, strict=True))
    elif sizes is not None:
        raise RnncError(f"{label}{_plain(signature)} has no parameters left for --input-size and "
                        f"--hidden-size; pass its parameters with --arg NAME=VALUE")
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    call = f"{label}({shown})"
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            raise RnncError(f"cannot call {label}{_plain(signature)} as {call}: {err}; give its "
                            f"parameters with --arg NAME=VALUE (repeatable)") from None
    try:
        cell = fn(*args, **kwargs)
    except RnncError as err:
        raise RnncError(f"{call}: {err}") from err
    except Exception as err:  # the user's code: one line naming the call and the line
        where = _where(err, path) if path else ""
        raise RnncError(f"{call} raised {type(err).__name__}{where}: {err}") from err
    if not isinstance(cell, Cell):
        got = "None" if cell is None else f"a {type(cell).__name__}"
        raise RnncError(f"{call} returned {got}, expected an rnnc.Cell "
                        f"(does the factory end with 'return c'?)")
    return cell


def load_cell(spec: str, input_size: int | None = None, hidden_size: int | None = None,
              args: dict[str, Any] | None = None):
    """A standard cell name, or ``path/file.py:factory``, called as
    ``factory(input_size, hidden_size, **args)``. A file is imported, so its code runs."""
    fn, label, path = _load_factory(spec)
    given = (input_size, hidden_size)
    sizes = None if given == (None, None) else tuple(
        g if g is not None else d for g, d in zip(given, DEFAULT_SIZES, strict=True))
    return call_factory(fn, label, sizes, dict(args or {}), path)


def _cell_names() -> list[str]:
    """The names ``rnnc dump`` accepts for a cell: the standard and published cells."""
    from rnnc.cells import NAMED, PUBLISHED

    return [*NAMED, *PUBLISHED]


# The modes of `rnnc dump --mode` and `rnnc bench --modes`: one vocabulary. "train" was dump's
# word for training before; it is still accepted, with a note.
DUMP_MODES = {"inference": ("inference",), "training": ("forward", "backward")}


def _svg(dot_text: str) -> str:
    """``dot_text`` drawn as SVG by Graphviz's ``dot`` executable."""
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if dot is None:
        raise RnncError("--format svg needs Graphviz's 'dot' executable on PATH (apt install "
                        "graphviz, brew install graphviz or conda install graphviz); "
                        "--format dot prints the graph's source without it")
    res = subprocess.run([dot, "-Tsvg"], input=dot_text, capture_output=True, text=True,
                         timeout=300, check=False)
    if res.returncode != 0:
        raise RnncError(f"{dot} -Tsvg failed with exit status {res.returncode}: "
                        f"{res.stderr.strip()}")
    return res.stdout


def _dump(args: argparse.Namespace) -> int:
    import rnnc
    from rnnc import passes
    from rnnc.api import backend_pipeline
    from rnnc.dot import to_dot, to_dot_all
    from rnnc.ir import retype

    named: dict[str, Any] = {}
    for name, value in args.arg:
        if name in named:
            raise RnncError(f"--arg {name} given twice")
        named[name] = value
    if args.mode == "train":
        sys.stderr.write("rnnc dump: note: --mode train is now --mode training (the word rnnc "
                         "bench --modes uses); 'train' still works\n")
    cell = load_cell(args.cell, args.input_size, args.hidden_size, named)
    modes = DUMP_MODES["training" if args.mode == "train" else args.mode]
    if args.schedule:
        for mode in modes:
            print(_schedule_text(cell, mode, args.backend))
        return 0
    drawn = []
    for mode in modes:
        if args.format == "text":
            print(rnnc.dump(cell, after=args.after, mode=mode, backend=args.backend))
            print()
            continue
        names = backend_pipeline(mode, args.backend)
        if args.after != "all":
            if args.after not in names:
                raise RnncError(f"--after must be a pass of the {mode} pipeline "
                                f"({', '.join(names)}) or 'all', got {args.after!r}")
            names = names[:names.index(args.after) + 1]
        drawn.append((passes.run(retype(cell.program(), "f32"), names), f"{cell.name} {mode}"))
    if args.format == "dot":
        for program, title in drawn:
            sys.stdout.write(to_dot(program, title))
            print()
    elif args.format == "svg":  # one picture: both programs of training in one graph
        sys.stdout.write(_svg(to_dot_all(drawn, f"{cell.name} {args.mode}")))
    return 0


def _schedule_text(cell: Any, mode: str, backend: str | None) -> str:
    """How ``backend`` (None: rnnc.compile's default) runs ``cell``'s program of ``mode``: its
    default schedule (rnnc.backends.schedule), one field a line under a title."""
    from rnnc import backends, passes
    from rnnc.api import backend_pipeline
    from rnnc.ir import retype
    from rnnc.settings import fastest_backend

    name = fastest_backend() if backend is None else backend
    program = passes.run(retype(cell.program(), "f32"), backend_pipeline(mode, name))
    # The schedule does not depend on the GPU: an emulated CUDA backend derives the same.
    runner = backends.get(name, **({"emulate": True} if name == "cuda" else {}))
    return f"# {cell.name} {mode}: schedule of backend {name}\n" \
        f"{runner.schedule(program, mode).describe()}\n"


def _demo(args: argparse.Namespace) -> int:
    from rnnc.tools.demo import run

    return run(quick=args.quick)


def backend_names() -> tuple[str, ...]:
    """The backends ``rnnc dump --backend`` accepts."""
    from rnnc.backends import names

    return names()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rnnc", description="rnnc: a compiler for recurrent cells.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    dump = sub.add_parser(
        "dump", help="print a cell's IR after the optimization passes",
        description="Print a cell's IR after the optimization passes. A path/file.py:factory "
                    "cell imports (runs) that Python file, then calls "
                    "factory(input_size, hidden_size, **args).")
    dump.add_argument("cell", help=" | ".join([*_cell_names(), "path/file.py:factory"]))
    dump.add_argument("--after", default="all", help="a pass name, or 'all' (default)")
    dump.add_argument("--mode", choices=(*DUMP_MODES, "train"), default="inference",
                      metavar="{" + ",".join(DUMP_MODES) + "}",
                      help="inference (default), or training: the training forward, then "
                           "the backward ('train' is accepted too)")
    dump.add_argument("--backend", choices=backend_names(), default=None,
                      help="show the passes this backend runs (default: rnnc.compile's "
                           "default, llvm where it works; llvm leaves parallel-scan off)")
    dump.add_argument("--format", choices=("text", "dot", "svg"), default="text",
                      help="text (default), dot (Graphviz source) or svg (drawn by Graphviz's "
                           "dot executable, which must be installed)")
    dump.add_argument("--input-size", type=_positive, default=None,
                      help=f"the factory's first argument (default {DEFAULT_SIZES[0]})")
    dump.add_argument("--hidden-size", type=_positive, default=None,
                      help=f"the factory's second argument (default {DEFAULT_SIZES[1]})")
    dump.add_argument("--arg", type=parse_arg, action="append", default=[],
                      metavar="NAME=VALUE",
                      help="a keyword argument of the factory, repeatable; VALUE is a Python "
                           "literal (3, 0.5, True, 'text', (1, 2)) or a bare word taken as text. "
                           "The sizes go to the first two positional parameters that no --arg "
                           "names; a factory with fewer gets the --arg values only")
    dump.add_argument("--schedule", action="store_true",
                      help="print how the backend runs the program instead of its IR: its "
                           "schedule, every decision of how to run it (rnnc.backends.schedule)")
    dump.set_defaults(func=_dump)

    demo = sub.add_parser("demo", help="define, optimize, check, train and time a custom cell")
    demo.add_argument("--quick", action="store_true", help="smaller sizes (for tests)")
    demo.set_defaults(func=_demo)

    from rnnc.tools import bench as bench_module

    bench = sub.add_parser("bench", help="time rnnc against PyTorch (and JAX) on C1-C4")
    bench_module.add_arguments(bench)
    bench.set_defaults(func=bench_module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    threads = getattr(args, "threads", None)
    if args.command == "bench" and threads is not None and threads < 1:
        sys.stderr.write(f"rnnc bench: error: --threads must be a positive integer, got "
                         f"{threads} (leave it out for all available cores)\n")
        return 2
    if args.command == "bench":  # the command line its Markdown report quotes
        words = list(sys.argv[1:] if argv is None else argv)
        args.argv = words[words.index("bench") + 1:]
    try:
        return args.func(args)
    except RnncError as err:
        message = " ".join(str(err).split("\n"))
        sys.stderr.write(f"rnnc {args.command}: error: {message}\n")
        return 2
    except BrokenPipeError:
        # The reader went away (`rnnc dump ... | head`): stop quietly, as other tools do. Point
        # stdout at /dev/null so that the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
