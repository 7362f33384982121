"""The docs tell the truth: every IR listing in README.md and docs/*.md is what the compiler
prints today, every command they show parses (and every ``rnnc dump`` runs), every Python block
in docs/*.md runs as pasted, and every relative link points at a file that exists.

A listing is a fenced block with no language whose first line is ``program ...``. Its source is
the nearest code block above it that runs something: a ```bash block's ``rnnc dump`` commands
or a ```python block. The listing must be one of the blank-line-separated chunks that source
prints, the one with the same first line. After a change to the compiler, rewrite the listings
with ``pytest tests/test_docs.py tests/test_readme.py --update-goldens`` and review the diff.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKDOWN = [ROOT / "README.md", *DOCS]


@dataclass
class Block:
    """One fenced code block: its language tag, text and 1-based first line in the file."""

    lang: str
    text: str
    line: int


def blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file, in order."""
    found, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^```(\S*)\s*$", line)
        if lang is None and fence:
            lang, start, lines = fence.group(1), number + 1, []
        elif lang is not None and line.startswith("```"):
            found.append(Block(lang, "\n".join(lines) + "\n", start))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path.name}: unclosed code block from line {start - 1}"
    return found


def commands(block: Block) -> list[list[str]]:
    """The shell commands of a ```bash block, split into words, without comments."""
    out = []
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def chunks(output: str) -> list[str]:
    """The programs a dump printed, each stripped of surrounding blank lines."""
    return [c.strip("\n") for c in re.split(r"\n\s*\n", output) if c.strip()]


def run_dump(argv: list[str]) -> str:
    """``rnnc dump ...`` in this process, from the repository root; its stdout."""
    from rnnc.tools.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        os.chdir(cwd)
    assert code == 0, f"rnnc {shlex.join(argv)} exited with {code}"
    return out.getvalue()


def run_python(code: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a code block as pasted into a fresh interpreter session: its own namespace, an empty
    working directory and cache directory. Returns what it printed."""
    if re.search(r"^\s*(import|from) torch\b|rnnc\.torch\b", code, re.M):
        pytest.importorskip("torch")
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    script = work / "block.py"
    script.write_text(f"# {where}\n{code}")
    env = {**os.environ, "RNNC_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # A fresh interpreter, as a reader pastes the block, rather than this long-lived worker.
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr}"
    return done.stdout


def _source_output(path: Path, block: Block, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> str:
    if block.lang == "python":
        return run_python(block.text, f"{path.name}:{block.line}", tmp_path, monkeypatch)
    dumps = [words[1:] for words in commands(block) if words[:2] == ["rnnc", "dump"]]
    return "\n\n".join(run_dump(argv) for argv in dumps)


def _is_source(block: Block) -> bool:
    if block.lang == "python":
        return True
    return block.lang == "bash" and any(w[:2] == ["rnnc", "dump"] for w in commands(block))


def listings(path: Path) -> list[tuple[Block, Block | None]]:
    """Every IR listing of ``path`` with the block whose output it shows."""
    out, source = [], None
    for block in blocks(path):
        if _is_source(block):
            source = block
        elif block.lang == "" and block.text.startswith("program "):
            out.append((block, source))
    return out


def check_listings(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   update: bool) -> int:
    """Compare (or with ``update`` rewrite) every listing of ``path``; the number checked."""
    text = path.read_text()
    outputs: dict[int, list[str]] = {}
    failures, replacements = [], []
    found = listings(path)
    for listing, source in found:
        assert source is not None, f"{path.name}:{listing.line}: a listing with no command above"
        if source.line not in outputs:
            outputs[source.line] = chunks(_source_output(path, source, tmp_path, monkeypatch))
        shown = listing.text.strip("\n")
        header = shown.splitlines()[0]
        candidates = [c for c in outputs[source.line] if c.splitlines()[0] == header]
        if shown in candidates:
            continue
        where = f"{path.name}:{listing.line} (output of the block at line {source.line})"
        if not candidates:
            failures.append(f"{where}: no program {header!r} in the output")
            continue
        best = max(candidates, key=lambda c: difflib.SequenceMatcher(None, c, shown).ratio())
        replacements.append((listing, best))
        diff = "\n".join(difflib.unified_diff(shown.splitlines(), best.splitlines(), "docs",
                                              "compiler", lineterm=""))
        failures.append(f"{where}:\n{diff}")
    if update and replacements:
        lines = text.splitlines(keepends=True)
        for listing, best in sorted(replacements, key=lambda r: -r[0].line):
            end = listing.line - 1 + len(listing.text.splitlines())
            lines[listing.line - 1:end] = [best + "\n"]
        path.write_text("".join(lines))
        failures = [f for f in failures if "no program" in f]
    assert not failures, ("listings differ from the compiler (rewrite them with --update-goldens "
                          "and review the diff):\n" + "\n".join(failures))
    return len(found)


def _bench_parser() -> argparse.ArgumentParser:
    from rnnc.tools import bench

    parser = argparse.ArgumentParser(prog="benchmarks/run.py", exit_on_error=False)
    bench.add_arguments(parser)
    return parser


def check_commands(path: Path) -> None:
    """Every ``rnnc`` and ``python FILE`` command of the file's ```bash blocks parses."""
    from rnnc.tools.cli import build_parser

    for block in blocks(path):
        if block.lang != "bash":
            continue
        for words in commands(block):
            where = f"{path.name}:{block.line}: {shlex.join(words)}"
            for part in _split_and(words):
                if part[0] == "rnnc":
                    try:
                        build_parser().parse_args(part[1:])
                    except SystemExit as err:
                        pytest.fail(f"{where}: does not parse ({err})")
                elif part[0] == "python" and part[1:2] and part[1].endswith(".py"):
                    assert (ROOT / part[1]).is_file(), f"{where}: no file {part[1]}"
                    if part[1] == "benchmarks/run.py":
                        try:
                            _bench_parser().parse_args(part[2:])
                        except (argparse.ArgumentError, SystemExit) as err:
                            pytest.fail(f"{where}: does not parse ({err})")


def _split_and(words: list[str]) -> list[list[str]]:
    parts, current = [], []
    for word in words:
        if word == "&&":
            parts.append(current)
            current = []
        else:
            current.append(word)
    return [p for p in [*parts, current] if p]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_listings_are_what_the_compiler_prints(path, tmp_path, monkeypatch, update_goldens):
    count = check_listings(path, tmp_path, monkeypatch, update_goldens)
    if path.name in ("optimizing.md", "passes.md"):
        assert count >= 3, f"{path.name} should show IR listings"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_commands_parse(path):
    check_commands(path)


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_dump_commands_run(path, capsys):
    for block in blocks(path):
        if block.lang == "bash":
            for words in commands(block):
                if words[:2] == ["rnnc", "dump"]:
                    # a program, a graph, or (--schedule) how a backend runs each program
                    expected = ("# ",) if "--schedule" in words else ("program", "digraph")
                    assert run_dump(words[1:]).startswith(expected)


# What a block prints, by page and the heading it is under: the blocks' comments say so.
PRINTS = {
    ("cells.md", "## float32 and float64"): ["float64 float64"],
    ("cells.md", "## Random masks: zoneout and variational dropout"): ["True"],
    ("cells.md", "## Trusting a new cell: the oracle and `check=True`"): ["True"],
    ("layers.md", "# Layers, weights and PyTorch"): ["(20, 8, 128) (4, 8, 64) (20, 8, 32)"],
    ("porting.md", "## From nn.LSTM"): ["True True"],
    ("porting.md", "## From a hand-written torch cell"): ["'forget_bias_l0_reverse']", "True"],
    ("porting.md", "## From Keras"): ["True True", "[(3, 16), (4, 16), (16,)]"],
}


def heading(path: Path, line: int) -> str:
    """The last heading above line ``line`` of ``path``."""
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group().count("\n"), path.read_text(),
                  flags=re.S | re.M)
    return next(h for h in reversed(text.splitlines()[:line]) if re.match(r"#+ ", h))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_in_docs_run(path, tmp_path, monkeypatch):
    for block in blocks(path):
        if block.lang == "python":
            out = run_python(block.text, f"{path.name}:{block.line}", tmp_path, monkeypatch)
            for expected in PRINTS.get((path.name, heading(path, block.line)), []):
                assert expected in out, f"{path.name}:{block.line} printed {out!r}"


def test_every_printing_block_is_found():
    """Each entry of PRINTS names a page and heading with a Python block: a moved block
    would otherwise go unchecked."""
    found = {(p.name, heading(p, b.line)) for p in DOCS for b in blocks(p) if b.lang == "python"}
    assert set(PRINTS) <= found, set(PRINTS) - found


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_relative_links_exist(path):
    # Links in the prose: code blocks and code spans hold IR like `slice[start=0](%1)`.
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`]*`", "", text)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        linked = path.parent / target if target else path
        assert linked.exists(), f"{path.name}: broken link {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{path.name}: no heading #{anchor} in {target}"


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_no_citation_of_files_outside_the_repository():
    """DESIGN.md, BENCHMARKS.md and ../shared live outside the repository: cite docs/ instead."""
    pattern = re.compile(r"BENCHMARKS\.md|DESIGN\.md|\.\./shared|shared/seeds")
    offenders = []
    for folder, subfolders, files in os.walk(ROOT):
        # Hidden folders (.git, .venv, .ci) and build metadata are not the project's text.
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and
                         not d.endswith(".egg-info") and d != "__pycache__"]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in (".py", ".md", ".toml", ".txt") or path == Path(__file__):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_docs_exist_and_readme_links_them():
    readme = (ROOT / "README.md").read_text()
    for name in ("architecture.md", "passes.md", "benchmarks.md", "weights.md", "porting.md",
                 "cells.md", "layers.md", "backends.md", "optimizing.md"):
        assert (ROOT / "docs" / name).is_file(), name
        assert f"(docs/{name})" in readme, f"README does not link docs/{name}"


def test_benchmarks_show_the_chart_and_date_the_table():
    """The chart docs/benchmarks.md shows is in the repository, small, drawn by the command it
    names; the full table says when it was measured and that it is to be measured again."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    images = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    assert images, "docs/benchmarks.md shows no chart"
    for image in images:
        path = ROOT / "docs" / image
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size < 100_000
        assert f"--png docs/{image}" in text, f"no command in docs/benchmarks.md draws {image}"
    assert re.search(r"^## The table of \d{4}-\d\d-\d\d \(to be re-measured\)$", text, re.M)
