"""LLVM modules are optimized and emitted in a forked child, so that the memory LLVM's pipeline
keeps does not pile up in the process; where the child cannot run or fails, the process
compiles itself, with the same result or the same error."""

from __future__ import annotations

import gc
import os

import pytest

pytest.importorskip("llvmlite")

from rnnc.backends.llvm import cache, isolated  # noqa: E402

pytestmark = pytest.mark.skipif(not isolated.AVAILABLE, reason="compiles in a child on Linux")


def _ir(k: int, length: int = 2000) -> str:
    """A distinct function of ``length`` dependent additions (no two modules alike)."""
    body = "\n".join(f"  %v{i} = fadd double %v{i - 1}, {float(k * length + i)!r}"
                     for i in range(1, length))
    return f"define double @f(double %v0) {{\n{body}\n  ret double %v{length - 1}\n}}\n"


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_the_child_does_the_work_and_hands_back_its_bytes() -> None:
    assert int(isolated.run(lambda: str(os.getpid()).encode())) != os.getpid()
    assert isolated.run(lambda: bytes(3 << 20)) == bytes(3 << 20)  # more than a pipe holds


def test_a_failing_child_gives_none_and_the_process_raises_the_error() -> None:
    def fails() -> bytes:
        raise ValueError("no")

    assert isolated.run(fails) is None
    with pytest.raises(RuntimeError):  # llvmlite's own parse error, raised here
        cache.compile_ir("define double @f( {")


def test_without_a_child_the_process_compiles_the_same_code(monkeypatch) -> None:
    text = _ir(0, 50)
    forked = cache.compile_ir(text)
    monkeypatch.setattr(isolated, "AVAILABLE", False)
    assert cache.compile_ir(text) == forked == cache.compile_here(text)


def test_every_module_is_compiled_in_a_child(monkeypatch) -> None:
    monkeypatch.setattr(cache, "compile_here", lambda text: str(os.getpid()).encode())
    assert int(cache.compile_ir(_ir(0, 5))) != os.getpid()


@pytest.mark.slow
def test_compiling_many_modules_does_not_grow_the_process() -> None:
    """Compiled in the process, each of these modules leaves about 0.7 MiB behind (7 MiB in
    all, measured); compiled in a child, 0.04 MiB in all."""
    for k in range(3):  # the first compiles settle what every compile needs
        cache.compile_ir(_ir(1000 + k))
    gc.collect()
    before = _rss_mib()
    for k in range(10):
        cache.compile_ir(_ir(k))
    gc.collect()
    assert _rss_mib() - before < 3
