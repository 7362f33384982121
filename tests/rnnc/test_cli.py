"""The rnnc command: every subcommand, its --help, and bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rnnc
from rnnc.tools.cli import main
from rnnc.tools.demo import cache_note


def rnnc_cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rnnc.tools.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def assert_one_line_error(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    for fragment in fragments:
        assert fragment in res.stderr, res.stderr


@pytest.mark.parametrize("command", [[], ["dump"], ["demo"], ["bench"]])
def test_help(command):
    res = rnnc_cli(*command, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: rnnc" in res.stdout


@pytest.mark.parametrize("args", [
    ["frobnicate"],
    ["dump", "lstm", "--mode", "sideways"],
    ["dump", "lstm", "--hidden-size", "zero"],
    ["dump", "lstm", "--hidden-size", "0"],
    ["dump", "no_such_cell"],
    ["dump", "lstm", "--after", "no-such-pass"],
    ["dump", "missing_file.py:factory"],
    ["dump", "lstm", "--input-size", "-3"],
    ["dump", "lstm", "--arg", "novalue"],
    ["dump", "lstm", "--arg", "1x=2"],
    ["dump", "lstm", "--arg", "n=[1,"],
    ["dump", "lstm", "--arg", "n=two words"],
    ["dump", "lstm", "--arg", "reset_after=True"],
    ["dump", "gru", "--arg", "reset_after=True", "--arg", "reset_after=False"],
    ["bench", "--threads", "-1"],
    ["bench", "--threads", "0"],
])
def test_bad_argument_is_one_line_and_exit_2(args):
    res = rnnc_cli(*args)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_dump_text_every_pass(capsys):
    assert main(["dump", "lstm", "--input-size", "3", "--hidden-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "lstm inference: traced" in out
    assert "scan forward" in out


def test_dump_training_dot(capsys):
    assert main(["dump", "gru", "--mode", "training", "--format", "dot"]) == 0
    out = capsys.readouterr().out
    assert out.count("digraph") == 2  # training forward and backward
    assert "scan reverse" in out


def test_dump_mode_train_still_works_with_a_note(capsys):
    assert main(["dump", "gru", "--mode", "training", "--input-size", "2", "--hidden-size",
                 "3", "--after", "canonicalize"]) == 0
    training = capsys.readouterr()
    assert main(["dump", "gru", "--mode", "train", "--input-size", "2", "--hidden-size", "3",
                 "--after", "canonicalize"]) == 0
    train = capsys.readouterr()
    assert train.out == training.out and "program gru backward" in train.out
    assert training.err == "" and "--mode train is now --mode training" in train.err


def test_dump_and_bench_share_the_mode_vocabulary():
    from rnnc.tools.bench import MODES
    from rnnc.tools.cli import DUMP_MODES

    assert tuple(DUMP_MODES) == tuple(MODES) == ("inference", "training")


def test_dump_help_lists_every_cell_it_accepts():
    from rnnc.cells import NAMED, PUBLISHED
    from rnnc.tools.cli import build_parser, load_cell

    dump = build_parser()._subparsers._group_actions[0].choices["dump"]
    listed = next(a.help for a in dump._actions if a.dest == "cell").split(" | ")
    assert listed[-1] == "path/file.py:factory"
    assert sorted(listed[:-1]) == sorted({*NAMED, *PUBLISHED}) and len(listed) == 22
    for name in listed[:-1]:
        assert isinstance(load_cell(name, 2, 4), rnnc.Cell), name


@pytest.mark.parametrize("backend, scans", [("numpy", True), ("llvm", False), ("cuda", True),
                                            (None, False)])
def test_dump_backend_shows_what_that_backend_runs(backend, scans, capsys):
    """The last listing is the program rnnc.compile builds for that backend: LLVM leaves
    parallel-scan off by default, so its min_gru keeps the loop."""
    argv = ["dump", "min_gru", "--input-size", "2", "--hidden-size", "3"]
    assert main(argv + ([] if backend is None else ["--backend", backend])) == 0
    out = capsys.readouterr().out
    assert ("linear_scan" in out) is scans and ("after parallel-scan" in out) is scans
    last = out.strip().split("\n\n")[-1].splitlines()
    assert last[0] == "program min_gru inference: after fuse-elementwise (f32) {"
    if backend != "cuda":  # (compiling for CUDA needs CuPy or emulation; the pipeline is the
        # same as numpy's)
        fn = rnnc.compile(rnnc.cells.min_gru(2, 3), backend=backend)
        assert last[1:] == fn.ir().splitlines()[1:]


@pytest.mark.parametrize("backend, field", [("llvm", "team_split = 'columns'"),
                                            ("cuda", "fused_step = 'auto'"),
                                            ("numpy", "precision = 'fp32'")])
def test_dump_schedule_prints_how_the_backend_runs_each_program(backend, field, capsys):
    """One schedule per program of the mode, field by field, what backend.schedule gives."""
    argv = ["dump", "lstm", "--input-size", "2", "--hidden-size", "3", "--schedule",
            "--mode", "training", "--backend", backend]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "program" not in out  # the schedule, not the IR
    forward, backward = out.strip().split("\n\n")
    assert forward.splitlines()[0] == f"# lstm forward: schedule of backend {backend}"
    assert backward.splitlines()[0] == f"# lstm backward: schedule of backend {backend}"
    assert field in forward
    if backend == "cuda":  # a backward program keeps its GEMMs: derived per program
        assert "fused_step = 'never'" in backward
        assert "tile_depths = (16, 8, 4, 2, 1)" in forward
        assert "graph_steps = 256  (per call)" in forward
    if backend == "llvm":
        assert "team_min_work = 4194304  (per call)" in forward
        for line in ("gemm_row_block = 6", "gemm_k_chunk = 256", "kernel_nodes = 128",
                     "scan_workspace_bytes = 4194304", "blas_all_threads_min_work = 134217728"):
            assert line in forward


def _fake_dot(folder) -> str:
    """A ``dot`` executable that echoes its arguments and its input, for PATH."""
    folder.mkdir()
    dot = folder / "dot"
    dot.write_text("#!/bin/sh\necho \"<svg args='$*'>\"\ncat\necho '</svg>'\n")
    dot.chmod(0o755)
    return str(folder)


def test_dump_svg_draws_through_graphviz(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", _fake_dot(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    assert main(["dump", "gru", "--mode", "training", "--format", "svg"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<svg args='-Tsvg'>") and out.rstrip().endswith("</svg>")
    # One picture: the forward and the backward as two clusters of one graph.
    assert out.count("digraph") == 1 and "cluster_p0" in out and "cluster_p1" in out
    assert '"gru forward"' in out and '"gru backward"' in out


def test_dump_svg_without_graphviz_is_one_line_and_exit_2(monkeypatch, capsys):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    assert main(["dump", "gru", "--format", "svg"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "needs Graphviz's 'dot' executable" in err
    assert "--format dot" in err


def test_dump_user_file(tmp_path, capsys):
    path = tmp_path / "cells.py"
    path.write_text(textwrap.dedent("""
        import rnnc

        def indrnn(i, h):
            c = rnnc.Cell("indrnn")
            x = c.input("x", i)
            s = c.state("h", h)
            W = c.param("W", (i, h))
            u = c.param("u", (h,))
            new = rnnc.relu(x @ W + u * s)
            c.update(h=new)
            c.output("y", new)
            return c
    """))
    assert main(["dump", f"{path}:indrnn", "--hidden-size", "5"]) == 0
    assert "indrnn" in capsys.readouterr().out


def test_demo_says_whether_the_cache_was_warm(tmp_path):
    # A fresh cache directory: the first run compiles, a second process loads what it wrote.
    env = {**os.environ, "RNNC_CACHE_DIR": str(tmp_path / "cache")}
    first = rnnc_cli("demo", "--quick", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "all checks held" in first.stdout
    compiled = [line for line in first.stdout.splitlines() if "compiled and ran in" in line]
    assert len(compiled) == 1 and "cache cold: compiled to native code now" in compiled[0]
    assert f"saved to {tmp_path / 'cache'}" in compiled[0]
    second = rnnc_cli("demo", "--quick", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"cache warm: native code loaded from {tmp_path / 'cache'}" in second.stdout
    assert "cache cold" not in second.stdout


def test_cache_note_numpy_backend_and_memory_hit(tmp_path):
    cell = rnnc.cells.rnn(2, 3)
    x = np.zeros((2, 1, 2), np.float32)
    fn = rnnc.compile(cell, backend="numpy")
    fn(x, cell.init_params())
    assert cache_note(fn, ("inference",)) == "interpreted by the NumPy backend: no native code"
    pytest.importorskip("llvmlite")
    first = rnnc.compile(cell, backend="llvm", cache_dir=False)
    first(x, cell.init_params())
    assert cache_note(first, ("inference",)) == "cache cold: compiled to native code now"
    again = rnnc.compile(cell, backend="llvm", cache_dir=False)
    again(x, cell.init_params())
    assert cache_note(again, ("inference",)) == \
        "cache warm: native code reused from earlier in this process"


def test_dump_file_without_the_factory_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "cells.py"
    path.write_text("x = 1\n")
    res = rnnc_cli("dump", f"{path}:missing")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no function 'missing'" in res.stderr


# A cell file with factories of other signatures and broken ones, for `rnnc dump FILE:NAME`.
CELLS = textwrap.dedent("""
    import rnnc

    def sru(n, scale=1.0):
        c = rnnc.Cell("sru")
        x = c.input("x", n)
        h = c.state("h", n)
        W = c.param("W", (n, n))
        new = rnnc.tanh(x @ W + h) * scale
        c.update(h=new)
        c.output("y", new)
        return c

    def sized(input_size, hidden_size, act="tanh"):
        c = rnnc.Cell("sized_" + act)
        x = c.input("x", input_size)
        h = c.state("h", hidden_size)
        W = c.param("W", (input_size, hidden_size))
        new = getattr(rnnc, act)(x @ W + h)
        c.update(h=new)
        c.output("y", new)
        return c

    def returns_none(input_size, hidden_size):
        c = rnnc.Cell("forgot")

    def raises(input_size, hidden_size):
        raise ValueError("no such variant")

    def bad_shapes(input_size, hidden_size):
        c = rnnc.Cell("bad")
        x = c.input("x", input_size)
        W = c.param("W", (input_size + 1, hidden_size))
        return x @ W

    def needs_three(a, b, c):
        pass
""")


RAISE_LINE = CELLS.splitlines().index('    raise ValueError("no such variant")') + 1


@pytest.fixture
def cells_file(tmp_path):
    path = tmp_path / "cells.py"
    path.write_text(CELLS)
    return path


def test_dump_factory_of_another_signature_with_arg(cells_file, capsys):
    assert main(["dump", f"{cells_file}:sru", "--arg", "n=3", "--arg", "scale=0.5",
                 "--after", "canonicalize"]) == 0
    out = capsys.readouterr().out
    assert "program sru inference: after canonicalize (f32)" in out
    assert "inputs: x: f32[T,B,3]" in out
    assert "constant[value=0.5]" in out


def test_dump_arg_with_sizes_and_a_bare_word(cells_file, capsys):
    assert main(["dump", f"{cells_file}:sized", "--input-size", "2", "--hidden-size", "5",
                 "--arg", "act=relu"]) == 0
    out = capsys.readouterr().out
    assert "program sized_relu inference: traced (f32)" in out
    assert "inputs: x: f32[T,B,2]" in out and "states: h: f32[B,5]" in out
    assert "relu(" in out


def test_dump_arg_for_a_standard_cell(capsys):
    assert main(["dump", "rnn", "--input-size", "2", "--hidden-size", "3",
                 "--arg", "nonlinearity='relu'", "--after", "canonicalize"]) == 0
    out = capsys.readouterr().out
    assert "program rnn_relu inference: after canonicalize (f32)" in out


@pytest.mark.parametrize("factory, extra, fragments", [
    ("returns_none", [], ["returns_none(32, 64) returned None, expected an rnnc.Cell"]),
    ("raises", [], ["raises(32, 64) raised ValueError at ",
                    f"cells.py:{RAISE_LINE}: no such variant"]),
    ("bad_shapes", ["--input-size", "2"], ["bad_shapes(2, 64): ", "inner sizes differ"]),
    ("needs_three", [], ["cannot call needs_three(a, b, c) as needs_three(32, 64)",
                         "missing a required argument: 'c'", "--arg NAME=VALUE"]),
    ("sized", ["--arg", "colour=1"], ["unexpected keyword argument 'colour'"]),
    ("sru", ["--arg", "n=3", "--hidden-size", "4"],
     ["sru(n, scale=1.0) has no parameters left for --input-size and --hidden-size"]),
])
def test_dump_bad_factory_is_one_line_and_exit_2(cells_file, factory, extra, fragments):
    assert_one_line_error(rnnc_cli("dump", f"{cells_file}:{factory}", *extra), *fragments)


@pytest.mark.parametrize("source, fragments", [
    ("def f(:\n", ["cells.py:1: SyntaxError"]),
    ("import rnnc\n\nimport no_such_module_here\n",
     ["raised ModuleNotFoundError at ", "cells.py:3: No module named 'no_such_module_here'"]),
])
def test_dump_cell_file_that_fails_to_import_is_one_line(tmp_path, source, fragments):
    path = tmp_path / "cells.py"
    path.write_text(source)
    assert_one_line_error(rnnc_cli("dump", f"{path}:f"), *fragments)


def test_bench_bad_threads_names_the_option():
    assert_one_line_error(rnnc_cli("bench", "--threads", "-1"),
                          "--threads must be a positive integer, got -1")


def test_dump_into_a_closed_pipe_stops_quietly(tmp_path) -> None:
    # `rnnc dump ... | head`: the reader is gone before the listing is written.
    import os
    import subprocess
    import sys

    env = dict(os.environ, RNNC_CACHE_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "rnnc.tools.cli", "dump", "lstm", "--after",
                             "all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
