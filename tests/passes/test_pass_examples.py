"""Every pass's docstring example is what the compiler prints.

The module docstring of each pass file has an example: a line ``Example...::``, then an indented
block of DSL code that builds one small cell (``rnnc`` is imported for it), then indented
listings, each a program as ``rnnc.printer.format_program`` prints it (lines longer than the
docstring allows are wrapped, see ``wrap``). For each pass the module registers, the test traces
the cell, runs the pipeline of the first mode that has the pass (``mask-lengths``: the inference
pipeline with lengths) up to and including that pass, and requires in the docstring

- the listing after the pass, titled ``<cell> <mode>: after <pass>``, and
- a listing of the program the pass started from (its title may name another mode: both
  autodiff passes start from the forward after ``fuse-gate-matmuls``);

and every listing of the docstring must be one of the programs printed on the way, the one with
the same title. After a change to a pass or the printer, ``pytest
tests/passes/test_pass_examples.py --update-goldens`` rewrites the listings in place (only the
docstrings' listings; review the diff).
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import rnnc
from rnnc import passes
from rnnc.printer import format_program

ROOT = Path(__file__).resolve().parents[2]
INDENT = "    "  # listings and code are indented one level under their ``::`` line
WIDTH = 96 - len(INDENT)  # ruff allows 100 columns; keep a little room


def wrap(line: str) -> list[str]:
    """``line`` in pieces of at most ``WIDTH`` columns: each break falls after a ``)`` if it
    can, else at a space; continuation lines are indented 4 more than the line."""
    indent = len(line) - len(line.lstrip())
    out = []
    while len(line) > WIDTH:
        cut = line.rfind(") ", 0, WIDTH) + 1 or line.rfind(" ", 0, WIDTH)
        if cut <= indent + 4:  # no space to break at: leave it long
            break
        out.append(line[:cut])
        line = " " * (indent + 4) + line[cut:].lstrip()
    return [*out, line]


def render(program_text: str) -> str:
    """A printed program as the docstring shows it: long lines wrapped."""
    return "\n".join(piece for line in program_text.splitlines() for piece in wrap(line))


@dataclass
class Listing:
    """A program listing of a docstring: its text (dedented) and its line span in the file."""

    text: str
    first: int  # 0-based index of its first line in the file
    stop: int  # one past its last line

    @property
    def title(self) -> str:
        return self.text.splitlines()[0]


@dataclass
class Example:
    path: Path
    code: str
    listings: list[Listing]


def _module_path(module: str) -> Path:
    return ROOT / "passes" / f"{module}.py"


def parse_example(path: Path) -> Example:
    """The example of a pass file's module docstring."""
    lines = path.read_text().splitlines()
    doc = ast.parse("\n".join(lines)).body[0]
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), \
        f"{path.name}: no module docstring"
    begin, end = doc.lineno - 1, doc.end_lineno
    head = next((k for k in range(begin, end) if re.match(r"Example\b.*::\s*$", lines[k])),
                None)
    assert head is not None, f"{path.name}: the docstring has no 'Example...::' section"
    k = head + 1
    while k < end and not lines[k].strip():
        k += 1
    code = []
    while k < end and (lines[k].startswith(INDENT) or not lines[k].strip()):
        code.append(lines[k])
        k += 1
    listings = []
    for k in range(head, end):
        if lines[k].startswith(INDENT + "program "):
            stop = next((j for j in range(k, end) if lines[j] == INDENT + "}"), None)
            assert stop is not None, f"{path.name}:{k + 1}: the listing has no closing '}}'"
            stop += 1
            text = "\n".join(line[len(INDENT):] for line in lines[k:stop])
            listings.append(Listing(text, k, stop))
    return Example(path, textwrap.dedent("\n".join(code)).strip() + "\n", listings)


def build_cell(example: Example) -> rnnc.Cell:
    namespace: dict = {"rnnc": rnnc}
    exec(compile(example.code, f"{example.path.name} (docstring example)", "exec"), namespace)
    cells = [v for v in namespace.values() if isinstance(v, rnnc.Cell)]
    assert len(cells) == 1, f"{example.path.name}: the example should build exactly one Cell"
    return cells[0]


def passes_of(module: str) -> list[str]:
    """The pass names ``rnnc.passes.<module>`` registers, in registration order."""
    passes._load()
    return [n for n, fn in passes.PASSES.items() if fn.__module__ == f"rnnc.passes.{module}"]


def where_it_runs(name: str) -> tuple[str, bool]:
    """The first mode whose pipeline runs pass ``name``, and whether only with lengths."""
    for masked in (False, True):
        for mode in passes.MODES:
            if name in passes.pipeline(mode, masked=masked):
                return mode, masked
    raise AssertionError(f"{name} is in no pipeline")


def stages(cell: rnnc.Cell, name: str) -> list[str]:
    """The program traced and after each pass of its pipeline up to the first ``name``."""
    mode, masked = where_it_runs(name)
    names = passes.pipeline(mode, masked=masked)
    names = names[:names.index(name) + 1]
    printed = [format_program(cell.program(), f"{cell.name} {mode}: traced")]

    def show(done: str, program, seconds: float) -> None:
        printed.append(format_program(program, f"{cell.name} {mode}: after {done}"))

    passes.run(cell.program(), names, show)
    return [render(text) for text in printed]


def _indented(text: str) -> str:
    return "\n".join(INDENT + line if line else line for line in text.splitlines())


def _rewrite(path: Path, replacements: list[tuple[Listing, str]]) -> None:
    """Replace listings in the file, read again just before writing."""
    lines = path.read_text().splitlines(keepends=True)
    for listing, text in sorted(replacements, key=lambda r: -r[0].first):
        assert "".join(lines[listing.first:listing.stop]) == _indented(listing.text) + "\n", \
            f"{path.name} changed while the test ran; run it again"
        lines[listing.first:listing.stop] = [_indented(text) + "\n"]
    path.write_text("".join(lines))


def check_example(module: str, update: bool) -> int:
    """Compare (or with ``update`` rewrite) the listings of ``module``'s example; how many."""
    path = _module_path(module)
    example = parse_example(path)
    cell = build_cell(example)
    printed: dict[str, str] = {}
    required: list[tuple[str, str]] = []  # (what, expected text)
    for name in passes_of(module):
        run = stages(cell, name)
        printed.update((text.splitlines()[0], text) for text in run)
        required.append((f"the program before {name}", run[-2]))
        required.append((f"the program after {name}", run[-1]))
    failures, replacements = [], []
    for listing in example.listings:
        want = printed.get(listing.title)
        where = f"{path.name}:{listing.first + 1}"
        if want is None:
            failures.append(f"{where}: no program titled {listing.title!r} is printed on the "
                            f"way; titles: {sorted(printed)}")
        elif want != listing.text:
            replacements.append((listing, want))
            # The whole listing as context: the failure shows the expected text in full.
            diff = "\n".join(difflib.unified_diff(listing.text.splitlines(), want.splitlines(),
                                                  "docstring", "compiler", lineterm="",
                                                  n=len(want.splitlines())))
            failures.append(f"{where}: the listing differs from the compiler:\n{diff}")
    # A listing that differs is reported above: count it as the program its title names.
    shown = [printed.get(listing.title, listing.text) for listing in example.listings]
    bodies = {tuple(text.splitlines()[1:]) for text in shown}
    for what, want in required:
        if tuple(want.splitlines()[1:]) not in bodies:
            failures.append(f"{path.name}: the example does not show {what}; add it after the "
                            f"example code:\n\n{_indented(want)}\n")
    if update and replacements:
        _rewrite(path, replacements)
        failures = [f for f in failures if "differs from the compiler" not in f]
    assert not failures, (f"{path.name}: the docstring example is not what the compiler prints "
                          "(rewrite the listings with pytest tests/passes/test_pass_examples.py "
                          "--update-goldens and review the diff):\n" + "\n".join(failures))
    return len(example.listings)


@pytest.mark.parametrize("module", passes._MODULES)
def test_docstring_example_is_what_the_compiler_prints(module: str, update_goldens: bool) -> None:
    assert passes_of(module), f"rnnc.passes.{module} registers no pass"
    assert check_example(module, update_goldens) >= 2


def test_wrap_keeps_every_character_and_the_width() -> None:
    line = "  scan reverse " + " ".join(f"seqs(a{k}, b{k})" for k in range(12)) + " {"
    pieces = wrap(line)
    assert len(pieces) > 1 and all(len(p) <= WIDTH for p in pieces)
    assert " ".join(p.strip() for p in pieces) == line.strip()
    assert all(p.startswith("      ") for p in pieces[1:])
    assert wrap("  short") == ["  short"]
