"""The README's code is a promise: every Python block runs as pasted and prints what it says,
its two commands are the CI's, and it stays a front door (tests/test_docs.py checks the
listings, commands and Python blocks of every Markdown file; this file checks what is
particular to the README, and that docs/optimizing.md's LSTM is what rnnc.compile runs)."""

from __future__ import annotations

import re

import pytest

from tests.test_docs import ROOT, blocks, listings, run_python

README = ROOT / "README.md"
OPTIMIZING = ROOT / "docs" / "optimizing.md"
PYTHON = [b for b in blocks(README) if b.lang == "python"]


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


# What a block prints, by the section it is in: the README's comments say so.
PRINTS = {
    "## Your own cell": ["(32, 64) (20, 8, 32) (8, 64)", "scan forward"],
    "## The PyTorch drop-in": ["True torch.Size([10, 4, 32])"],
}


def _heading(line: int) -> str:
    """The last heading above line ``line`` of the README."""
    lines = README.read_text().splitlines()[:line]
    return next(h for h in reversed(lines) if re.match(r"#+ ", h))


@pytest.mark.parametrize("block", PYTHON, ids=[f"line{b.line}" for b in PYTHON])
def test_every_python_block_runs_as_pasted(block, tmp_path, monkeypatch) -> None:
    out = run_python(block.text, f"README.md:{block.line}", tmp_path, monkeypatch)
    for expected in PRINTS.get(_heading(block.line), []):
        assert expected in out, out


def test_python_blocks_are_found() -> None:
    # A block the parser missed would go untested, and so would a section PRINTS names.
    assert README.read_text().count("```python") == len(PYTHON)
    assert {_heading(b.line) for b in PYTHON} >= set(PRINTS)


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second() -> None:
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["pip install -e . && rnnc demo",
                        "pip install -e '.[test,torch]' && pytest"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_test_command_takes_the_pinned_cpu_torch() -> None:
    """An unpinned torch resolves to the newest release, a CUDA build of several GB on PyPI:
    the torch extra pins the release whose CPU build the project's machines install, and CI
    installs nothing before the README's command (so CI shows that the command alone works)."""
    # (tomllib is Python 3.11+; rnnc supports 3.10.)
    extra = re.search(r"^torch = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    torch = re.findall(r'"(torch\b[^"]*)"', extra.group(1))
    assert len(torch) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+", torch[0]), torch
    assert torch[0].removeprefix("torch==") in _section("Quick start")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert not any("torch" in line for line in ci[:-1]), ci


def test_dump_listings_are_the_programs_compile_runs() -> None:
    """The last listing of each dump in docs/optimizing.md (after fuse-elementwise) is the
    program that ``rnnc.compile`` optimizes for that mode, not only what ``rnnc dump`` prints."""
    import rnnc

    fn = rnnc.compile(rnnc.cells.lstm(3, 4))
    shown = {b.text.splitlines()[0]: b.text.strip("\n").splitlines()[1:]
             for b, _ in listings(OPTIMIZING)}
    for mode in ("inference", "backward"):
        header = f"program lstm {mode}: after fuse-elementwise (f32) {{"
        assert header in shown, f"docs/optimizing.md shows no {header!r}"
        assert shown[header] == fn.ir(mode).splitlines()[1:]


def test_optimizing_documents_the_lstm_it_lists() -> None:
    text = OPTIMIZING.read_text()
    assert "rnnc dump lstm --input-size 3 --hidden-size 4" in text
    assert "rnnc.cells.lstm(3, 4)" in text


def test_readme_is_a_front_door() -> None:
    """At most about 300 lines; it states the default backend and how long the suite takes,
    and links the page of each subject it leaves out."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert "**The default backend is LLVM**" in text
    assert "| `None` (default) | `\"llvm\"`" in _section("Backends")
    suite = _section("Quick start")
    assert re.search(r"about \d+ minutes on two idle cores", suite) and "pytest -m slow" in suite
    for page in ("cells", "porting", "layers", "backends", "optimizing", "device-calls"):
        assert f"(docs/{page}.md)" in text, page
