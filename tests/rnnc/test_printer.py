"""Golden-text tests of the printer.

The traced programs of the standard cells are stable and compared line by line against
``tests/rnnc/golden/*.txt``; regenerate with ``pytest tests/rnnc/test_printer.py
--update-goldens`` and review the diff. The optimized program (``fn.ir()``) changes with the
passes, so only its structure and determinism are checked.
"""

from __future__ import annotations

import pathlib
import re

import pytest

import rnnc
from rnnc import passes
from rnnc.printer import format_program

GOLDEN = pathlib.Path(__file__).parent / "golden"

CELLS = {
    "rnn_tanh": lambda: rnnc.cells.rnn(3, 4),
    "rnn_relu": lambda: rnnc.cells.rnn(3, 4, nonlinearity="relu"),
    "lstm": lambda: rnnc.cells.lstm(3, 4),
    "gru": lambda: rnnc.cells.gru(3, 4),
    "gru_v3": lambda: rnnc.cells.gru(3, 4, reset_after=False),
}

TYPE = r"f(32|64)\[[0-9TB,]*\]"
EQUATION = re.compile(
    rf"^ *%\d+: ({TYPE}|\(.*\)) = (\w+(\[[^\]]*\])?\([^()]*\)|%\d+\[\d+\]|fused\([^()]*\) \{{)"
    r"(  # [\w-]+)?$"
)
STRUCTURE = re.compile(
    r"^(program .*\{|  [a-z]+: .*|  (pre|post) \{|"
    r"  scan (forward|reverse).*\{| *yield .*| *\}|  results: .*)$"
)


@pytest.mark.parametrize("name", list(CELLS))
def test_traced_program_golden(name: str, update_goldens: bool) -> None:
    text = format_program(CELLS[name]().program()) + "\n"
    path = GOLDEN / f"{name}_traced.txt"
    if update_goldens:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run pytest with --update-goldens"
    assert text == path.read_text()


def check_structure(text: str) -> None:
    """One equation or structural line per line, types on binders, symbolic T and B."""
    lines = text.splitlines()
    assert lines[0].startswith("program ") and lines[-1] == "}"
    for line in lines:
        assert EQUATION.match(line) or STRUCTURE.match(line), f"unexpected line: {line!r}"
    body = [ln for ln in lines if EQUATION.match(ln)]
    assert body, "no equations"
    # The scan body is indented one level deeper than the scan header.
    scan = next(i for i, ln in enumerate(lines) if ln.startswith("  scan "))
    assert lines[scan + 1].startswith("    ")
    # Equations bind names %0, %1, ... in order within each region (no process-wide ids leak).
    assert not re.search(r"%\d{4,}", text), "node ids look global"
    assert "T" in text and "B" in text


@pytest.mark.parametrize("name", list(CELLS))
def test_traced_program_structure(name: str) -> None:
    check_structure(format_program(CELLS[name]().program()))


@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
def test_optimized_ir_structure_and_determinism(mode: str) -> None:
    a = rnnc.compile(rnnc.cells.lstm(3, 4), backend="numpy").ir(mode)
    # Compiled functions share optimized programs: run the passes afresh, on a cell traced
    # anew (other node ids), and print that.
    fresh = passes.run(rnnc.cells.lstm(3, 4).program(), passes.pipeline(mode))
    b = format_program(fresh, f"lstm {mode}")
    assert a == b, "two optimizations of the same cell print differently"
    assert a.splitlines()[0].startswith(f"program lstm {mode}")
    check_structure(a)
    # The symbolic sequence type of the input survives optimization.
    assert "x: f32[T,B,3]" in a


def test_float64_program_prints_f64() -> None:
    text = rnnc.compile(rnnc.cells.rnn(3, 4), backend="numpy").ir(dtype="f64")
    assert "f64[" in text and "f32[" not in text
