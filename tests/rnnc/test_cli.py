"""The rnnc command: every subcommand, its --help, and bad arguments."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from rnnc.cli import main


def rnnc_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rnnc.cli", *args], capture_output=True,
                          text=True, timeout=300)


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


def test_dump_train_dot(capsys):
    assert main(["dump", "gru", "--mode", "train", "--format", "dot"]) == 0
    out = capsys.readouterr().out
    assert out.count("digraph") == 2  # training forward and backward
    assert "scan reverse" in out


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


def test_demo_quick_exits_0():
    res = rnnc_cli("demo", "--quick")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all checks held" in res.stdout


def test_dump_file_without_the_factory_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "cells.py"
    path.write_text("x = 1\n")
    res = rnnc_cli("dump", f"{path}:missing")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no function 'missing'" in res.stderr
