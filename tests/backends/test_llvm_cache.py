"""The LLVM backend's code cache: disk round trip, damaged entries, keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc.backends.llvm import cache  # noqa: E402
from rnnc.backends.llvm.runtime import LlvmBackend  # noqa: E402
from rnnc.ir import retype  # noqa: E402


@pytest.fixture(scope="module")
def program():
    return rnnc.compile(rnnc.cells.rnn(2, 3)).program()


def _run(runner) -> np.ndarray:
    rng = np.random.default_rng(0)
    env = {"x": rng.standard_normal((4, 2, 2)).astype(np.float32),
           "h": np.zeros((2, 3), np.float32),
           **{k: v for k, v in rnnc.cells.rnn(2, 3).init_params(seed=0).items()}}
    return runner(env, {"T": 4, "B": 2})["y"]


def _fresh(root: Path) -> LlvmBackend:
    # A new in-process cache for the same directory: what another process would see.
    cache._CACHES.pop(root, None)
    return LlvmBackend(cache_dir=root)


def _entry(root: Path) -> Path:
    (entry,) = root.glob("*.o")
    return entry


def test_disk_round_trip(tmp_path: Path, program) -> None:
    first = _fresh(tmp_path).build(program)
    assert first.compiled.cached == "no"
    again = LlvmBackend(cache_dir=tmp_path).build(program)
    assert again.compiled.cached == "memory"
    loaded = _fresh(tmp_path).build(program)
    assert loaded.compiled.cached == "disk"
    np.testing.assert_array_equal(_run(loaded), _run(first))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_damaged_entry_is_deleted_and_rebuilt(tmp_path: Path, program, damage: str) -> None:
    expected = _run(_fresh(tmp_path).build(program))
    entry = _entry(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        for pos in range(len(data) // 3, len(data), 97):
            data[pos] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"\x7fELF" + bytes(200))
    entry.write_bytes(bytes(data))
    rebuilt = _fresh(tmp_path).build(program)
    assert rebuilt.compiled.cached == "no"
    np.testing.assert_array_equal(_run(rebuilt), expected)
    assert cache._decode(_entry(tmp_path).read_bytes()) is not None


def test_key_depends_on_program_dtype_and_convention(program) -> None:
    text = rnnc.printer.format_program(program)
    other = rnnc.printer.format_program(retype(program, "f64"))
    keys = {cache.key(text, "f32", "cblas"), cache.key(other, "f64", "cblas"),
            cache.key(text, "f32", "fortran")}
    assert len(keys) == 3
    assert cache.key(text, "f32", "cblas") == cache.key(text, "f32", "cblas")


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch, program) -> None:
    monkeypatch.setenv("RNNC_CACHE_DIR", str(tmp_path / "env"))
    cache._CACHES.pop(tmp_path / "env", None)
    LlvmBackend().build(program)
    assert len(list((tmp_path / "env").glob("*.o"))) == 1
