"""rnnc/process.py owns the process-wide state: it alone reads the environment, each variable
is declared there once (and listed in docs/environment.md), and every cache that lives as long
as the process has a bound named there."""

from __future__ import annotations

import ast
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from rnnc import process
from rnnc.errors import RnncValueError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("rnnc", "passes", "backends") for p in (ROOT / d).rglob("*.py"))
OWNER = ROOT / "rnnc" / "process.py"
ENVIRON = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_reads(text: str) -> list[int]:
    """The lines of ``text`` that touch the environment: ``os.environ``, ``os.getenv`` and
    the like, or one of them imported by name."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRON and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                ENVIRON & {a.name for a in node.names}:
            lines.append(node.lineno)
    return lines


def test_only_process_reads_the_environment() -> None:
    readers = [f"{p.relative_to(ROOT)}:{line}" for p in SOURCES if p != OWNER
               for line in environment_reads(p.read_text())]
    assert readers == []
    assert environment_reads(OWNER.read_text())  # the check sees a read where there is one


def test_only_process_registers_fork_handlers() -> None:
    registering = [str(p.relative_to(ROOT)) for p in SOURCES
                   if "register_at_fork" in p.read_text() and p != OWNER]
    assert registering == []  # the others register with process.at_fork


def test_the_check_sees_every_kind_of_read() -> None:
    for text in ("import os\nx = os.environ['A']", "import os\nos.getenv('A')",
                 "from os import environ", "import os\nos.environ.pop('A', None)"):
        assert environment_reads(text), text
    assert not environment_reads("import os\nos.path.join('a', 'b')")


def test_every_variable_is_declared_once_and_documented() -> None:
    named = {m for p in SOURCES for m in re.findall(r"\bRNNC_[A-Z_]+\b", p.read_text())}
    assert named <= set(process.ENV)
    table = (ROOT / "docs" / "environment.md").read_text()
    for name, var in process.ENV.items():
        assert var.name == name and var.doc
        assert f"| `{name}` |" in table, name


@pytest.mark.parametrize("name, text, want", [
    ("RNNC_CHECK", "", False), ("RNNC_CHECK", "0", False), ("RNNC_CHECK", " 1 ", True),
    ("RNNC_CHECK", "yes", True), ("RNNC_CHECK", "second-order", "second-order"),
    ("RNNC_TEAM", "", True), ("RNNC_TEAM", "0", False), ("RNNC_TEAM", "1", True),
    ("RNNC_THREADS", "", None), ("RNNC_THREADS", "3", 3), ("RNNC_THREADS", "1024", 1024),
    ("RNNC_CODE_CACHE_MB", "0", 0.0), ("RNNC_CODE_CACHE_MB", "1.5", 1.5),
    ("RNNC_BLAS", "", None), ("RNNC_BLAS", "mkl", "mkl"),
    ("RNNC_CACHE_DIR", " /tmp/x ", "/tmp/x")])
def test_a_variable_reads_as_declared(monkeypatch, name: str, text: str, want) -> None:
    monkeypatch.setenv(name, text)
    default = {"RNNC_CHECK": False, "RNNC_TEAM": True}.get(name)
    assert process.ENV[name].value(default) == want


@pytest.mark.parametrize("name, text", [
    ("RNNC_THREADS", "0"), ("RNNC_THREADS", "1025"), ("RNNC_THREADS", "two"),
    ("RNNC_THREADS", "²"), ("RNNC_THREADS", "-1"), ("RNNC_CODE_CACHE_MB", "-1"),
    ("RNNC_CODE_CACHE_MB", "inf"), ("RNNC_CODE_CACHE_MB", "lots"),
    ("RNNC_DISK_CACHE_MB", "nan")])
def test_a_bad_value_names_the_variable(monkeypatch, name: str, text: str) -> None:
    monkeypatch.setenv(name, text)
    with pytest.raises(RnncValueError, match=name):
        process.ENV[name].value()


def test_a_default_set_for_a_library_is_removed_after_and_never_overrides(monkeypatch) -> None:
    var = process.OPENBLAS_THREAD_TIMEOUT
    monkeypatch.delenv(var.name, raising=False)
    with process.default_while(var, "4"):
        assert var.text() == "4"
    assert var.name not in os.environ
    monkeypatch.setenv(var.name, "9")
    with process.default_while(var, "4"):
        assert var.text() == "9"
    assert var.text() == "9"


def test_every_cache_bound_is_a_finite_number() -> None:
    for cache, name in process.CACHE_BOUNDS.items():
        bound = getattr(process, name)
        assert isinstance(bound, int) and not isinstance(bound, bool), cache
        assert 0 < bound < math.inf, cache


def test_the_llvm_code_caches_of_directories_are_bounded(tmp_path, monkeypatch) -> None:
    pytest.importorskip("llvmlite")
    from rnnc.backends.llvm import cache

    monkeypatch.setattr(process, "CODE_CACHE_DIRECTORIES", 2)
    monkeypatch.setattr(cache, "_CACHES", {})
    roots = [tmp_path / f"d{k}" for k in range(4)]
    first = cache.code_cache(roots[0])
    assert cache.code_cache(roots[0]) is first  # one cache per directory while it is kept
    for root in roots[1:]:
        cache.code_cache(root)
        assert len(cache._CACHES) <= 2
    assert list(cache._CACHES) == roots[2:]  # least recently used first out
    assert cache.code_cache(roots[0]) is not first


def test_the_gemm_choices_are_bounded(tmp_path, monkeypatch) -> None:
    pytest.importorskip("llvmlite")
    from rnnc.backends.llvm import autotune, blas

    library = blas.get()
    twin = blas.Blas("twin", library.sgemm_addr, library.dgemm_addr, library.convention)
    monkeypatch.setattr(blas, "_load", {library.name: library, "twin": twin}.get)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    monkeypatch.setattr(process, "GEMM_CHOICES", 3)
    for m in range(1, 7):
        assert autotune.choose(m, 2, 2, np.float64, [library.name, "twin"], cache_dir=tmp_path,
                               reps=1) in (library.name, "twin")
        assert len(autotune._CHOICES) <= 3
    assert [key.split(":")[1] for key in autotune._CHOICES] == ["4x2x2", "5x2x2", "6x2x2"]
