"""Cache faults and process safety (issue 19): a damaged, planted, swapped or hostile cache
file is never executed and never crashes rnnc; fork and spawn children finish; the in-memory
code cache stays within its bound; bad thread counts are RnncErrors."""

from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc import diskcache  # noqa: E402
from rnnc.backends.llvm import autotune, blas, cache  # noqa: E402
from rnnc.backends.llvm.runtime import LlvmBackend  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
REPO = Path(__file__).parents[2]


def _cell(k: int = 0) -> rnnc.Cell:
    c = rnnc.Cell(f"fault{k}")
    x = c.input("x", 2)
    h = c.state("h", 3)
    W = c.param("W", (2, 3))
    h_new = rnnc.tanh(x @ W + h * (0.5 + k / 64))
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _program(k: int = 0):
    return rnnc.compile(_cell(k), backend="numpy").program()


def _run(runner) -> np.ndarray:
    rng = np.random.default_rng(3)
    env = {"x": rng.standard_normal((4, 2, 2)).astype(np.float32),
           "h": np.zeros((2, 3), np.float32),
           "W": rng.standard_normal((2, 3)).astype(np.float32)}
    return runner(env, {"T": 4, "B": 2})["y"]


def _expected(k: int = 0) -> np.ndarray:
    return _run(LlvmBackend(cache_dir=False).build(_program(k), "inference"))


def _fresh(root: Path) -> LlvmBackend:
    """A backend with an empty in-memory cache for ``root``: what another process sees."""
    cache._CACHES.pop(root, None)
    return LlvmBackend(cache_dir=root)


def _entry(root: Path, program) -> Path:
    backend = LlvmBackend(cache_dir=root)
    return backend.cache.path(backend.code_key(program, "inference"))


def _leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(".tmp"))


def _rebuilt(root: Path, k: int = 0) -> None:
    """The program builds from scratch, computes the right thing, and leaves a good entry."""
    program = _program(k)
    runner = _fresh(root).build(program, "inference")
    assert runner.compiled.cached == "no"
    np.testing.assert_array_equal(_run(runner), _expected(k))
    assert _fresh(root).build(program, "inference").compiled.cached == "disk"
    assert _leftovers(root) == []


def _signed(directory: Path, body: bytes) -> bytes:
    """``body`` with a valid MAC: an entry as rnnc itself would sign it."""
    return body + hmac.new(diskcache._secret(directory), body, hashlib.sha256).digest()


def _body(header: bytes, payload: bytes = b"") -> bytes:
    return diskcache.MAGIC + struct.pack("<I", len(header)) + header + payload


# -- damaged and hostile entries

def _damaged(kind: str, good: bytes, directory: Path) -> bytes:
    (length,) = struct.unpack_from("<I", good, len(diskcache.MAGIC))
    start = len(diskcache.MAGIC) + 4
    header = json.loads(good[start:start + length])
    payload = good[start + length:-32]
    signed = {
        "bad json": lambda: _signed(directory, _body(b"{not json", payload)),
        "json list": lambda: _signed(directory, _body(b"[1, 2]", payload)),
        "missing keys": lambda: _signed(directory, _body(json.dumps(
            {"meta": header["meta"]}).encode(), payload)),
        "meta not a dict": lambda: _signed(directory, _body(json.dumps(
            dict(header, meta=[1])).encode(), payload)),
        "no plan": lambda: _signed(directory, _body(json.dumps(
            dict(header, meta={})).encode(), payload)),
        "header past the end": lambda: _signed(
            directory, diskcache.MAGIC + struct.pack("<I", 1 << 30) + b"{}"),
    }
    unsigned = {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "wrong magic": b"RNNC-LLVM-OBJ-1\n" + good[len(diskcache.MAGIC):],
        "only magic": diskcache.MAGIC,
        "one bit": good[:100] + bytes([good[100] ^ 1]) + good[101:],
    }
    return signed[kind]() if kind in signed else unsigned[kind]


@pytest.mark.parametrize("kind", [
    "bad json", "json list", "missing keys", "meta not a dict", "no plan",
    "header past the end", "truncated", "empty", "wrong magic", "only magic", "one bit"])
def test_damaged_entry_is_deleted_and_rebuilt(tmp_path: Path, kind: str) -> None:
    program = _program()
    _fresh(tmp_path).build(program, "inference")
    entry = _entry(tmp_path, program)
    entry.write_bytes(_damaged(kind, entry.read_bytes(), entry.parent))
    _rebuilt(tmp_path)


def test_unreadable_entry(tmp_path: Path) -> None:
    program = _program()
    _fresh(tmp_path).build(program, "inference")
    entry = _entry(tmp_path, program)
    entry.chmod(0)
    runner = _fresh(tmp_path).build(program, "inference")
    # root reads a mode-000 file anyway; anyone else cannot, and rebuilds.
    assert runner.compiled.cached == ("disk" if ROOT_USER else "no")
    np.testing.assert_array_equal(_run(runner), _expected())


def test_symlinked_entry_is_not_followed(tmp_path: Path) -> None:
    program = _program()
    _fresh(tmp_path / "a").build(program, "inference")
    elsewhere = tmp_path / "elsewhere.entry"
    shutil.copy(_entry(tmp_path / "a", program), elsewhere)
    # Another directory's entry for the same key: valid, but reached through a link.
    _fresh(tmp_path / "b").build(_program(1), "inference")
    link = _entry(tmp_path / "b", program)
    link.symlink_to(elsewhere)
    _rebuilt(tmp_path / "b")
    assert elsewhere.is_file() and not link.is_symlink()


def test_fifo_in_place_of_an_entry_does_not_block(tmp_path: Path) -> None:
    program = _program()
    _fresh(tmp_path).build(_program(1), "inference")  # makes the directory
    fifo = _entry(tmp_path, program)
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(
        target=lambda: done.append(_fresh(tmp_path).build(program, "inference")))
    worker.start()
    worker.join(60)
    if worker.is_alive():  # blocked opening the FIFO: unblock it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(60)
        pytest.fail("reading the cache blocked on a FIFO")
    np.testing.assert_array_equal(_run(done[0]), _expected())
    assert done[0].compiled.cached == "no" and stat.S_ISREG(os.stat(fifo).st_mode)


def test_oversized_entry_is_not_read(tmp_path: Path, monkeypatch) -> None:
    program = _program()
    _fresh(tmp_path).build(program, "inference")
    entry = _entry(tmp_path, program)
    with open(entry, "r+b") as f:  # sparse: no disk space used
        f.truncate(diskcache.MAX_ENTRY_BYTES + 1)
    _rebuilt(tmp_path)
    # A valid entry over the cap is refused too, and not written again.
    monkeypatch.setattr(diskcache, "MAX_ENTRY_BYTES", 1024)
    runner = _fresh(tmp_path).build(program, "inference")
    assert runner.compiled.cached == "no" and not entry.exists()


def test_directory_in_place_of_an_entry(tmp_path: Path) -> None:
    program = _program()
    _fresh(tmp_path).build(_program(1), "inference")
    entry = _entry(tmp_path, program)
    entry.mkdir()
    (entry / "keep").write_text("not ours to delete")
    for _ in range(2):
        runner = _fresh(tmp_path).build(program, "inference")
        assert runner.compiled.cached == "no"
        np.testing.assert_array_equal(_run(runner), _expected())
        assert _leftovers(tmp_path) == []  # the temporary file is cleaned up
    assert (entry / "keep").is_file()
    (entry / "keep").unlink()  # an empty directory is simply replaced
    _rebuilt(tmp_path)


def test_read_only_cache_directory(tmp_path: Path) -> None:
    _fresh(tmp_path).build(_program(1), "inference")
    directory = tmp_path / "llvm"
    directory.chmod(0o500)
    try:
        runner = _fresh(tmp_path).build(_program(), "inference")
        np.testing.assert_array_equal(_run(runner), _expected())
        written = _entry(tmp_path, _program()).exists()
        assert written == ROOT_USER  # root writes anyway; anyone else keeps it in memory
        assert _leftovers(tmp_path) == []
    finally:
        directory.chmod(0o700)


def test_cache_path_that_is_a_file_warns_once_and_keeps_code_in_memory(tmp_path: Path,
                                                                     monkeypatch) -> None:
    path = tmp_path / "file"
    path.write_text("not a directory")
    monkeypatch.setenv("RNNC_CACHE_DIR", str(path))
    cache._CACHES.pop(path, None)
    with pytest.warns(diskcache.CacheWarning, match="cannot be used"):
        runner = LlvmBackend().build(_program(), "inference")
    np.testing.assert_array_equal(_run(runner), _expected())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LlvmBackend().build(_program(1), "inference")  # no second warning
    assert path.read_text() == "not a directory"


@pytest.mark.parametrize("problem", ["world-writable", "another user"])
def test_directory_that_is_not_private_is_not_used(tmp_path: Path, problem: str) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    if problem == "world-writable":
        root.chmod(0o777)
    elif ROOT_USER:
        os.chown(root, 65534, 65534)
    else:
        pytest.skip("only root can give a directory to another user")
    cache._CACHES.pop(root, None)
    with pytest.warns(diskcache.CacheWarning):
        runner = LlvmBackend(cache_dir=root).build(_program(), "inference")
    np.testing.assert_array_equal(_run(runner), _expected())
    assert list(root.iterdir()) == []  # nothing written, not even the subdirectory


# The writers pin the environment part of the key: the source files may be edited while the
# tests run, and this test is about two writers, not about the key.
_WRITER = """
import sys
sys.path.insert(0, "tests/backends")
from test_cache_faults import _program
from rnnc.backends.llvm import cache
from rnnc.backends.llvm.runtime import LlvmBackend
cache._environment_key = lambda: sys.argv[1]
LlvmBackend().build(_program(), "inference")
"""


def test_two_processes_write_the_same_entry_at_once(tmp_path: Path, monkeypatch) -> None:
    pinned = "two writers"
    monkeypatch.setattr(cache, "_environment_key", lambda: pinned)
    env = dict(os.environ, RNNC_CACHE_DIR=str(tmp_path))
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, pinned], cwd=REPO, env=env)
               for _ in range(2)]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    runner = _fresh(tmp_path).build(_program(), "inference")
    assert runner.compiled.cached == "disk"
    np.testing.assert_array_equal(_run(runner), _expected())
    names = sorted(p.name for p in (tmp_path / "llvm").iterdir())
    assert len(names) == 2 and names[0] == diskcache.SECRET_NAME  # one secret, one entry


# -- the BLAS tuning file

def test_tuning_file_faults(tmp_path: Path, monkeypatch) -> None:
    library = blas.get()
    twin = blas.Blas("twin", library.sgemm_addr, library.dgemm_addr, library.convention)
    monkeypatch.setattr(blas, "_load", {library.name: library, "twin": twin}.get)
    candidates = [library.name, "twin"]
    path = tmp_path / "blas.json"
    for content in ("{not json", "[1, 2]", "\"text\""):
        monkeypatch.setattr(autotune, "_CHOICES", {})
        path.write_text(content)
        assert autotune.choose(8, 8, 8, np.float32, candidates, cache_dir=tmp_path, reps=1) \
            in candidates
        assert isinstance(json.loads(path.read_text()), dict)
    # A link to a file naming a valid choice is not followed: the shape is measured.
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({f"float32:8x8x8:{','.join(sorted(candidates))}": "twin"}))
    path.unlink()
    path.symlink_to(elsewhere)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    measured = []
    real_time = autotune._time_gemm
    monkeypatch.setattr(autotune, "_time_gemm", lambda lib, *a: measured.append(lib) or
                        real_time(lib, *a))
    autotune.choose(8, 8, 8, np.float32, candidates, cache_dir=tmp_path, reps=1)
    assert len(measured) == 2
    assert not path.is_symlink() and "twin" in elsewhere.read_text()
    assert _leftovers(tmp_path) == []


# -- CUDA emulation libraries

needs_cxx = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                               reason="CUDA emulation needs a C++ compiler")

KERNEL = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""
OTHER_KERNEL = KERNEL.replace("*= a", "+= a")

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE* f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
extern "C" void launch_scale(unsigned g, unsigned b, void** a) { (void)g; (void)b; (void)a; }
"""


def _scale(cache_dir: Path, source: str = KERNEL) -> np.ndarray:
    from rnnc.backends.cuda.emulate import EmulatedModule

    x = np.arange(4, dtype=np.float32)
    EmulatedModule(source, ["scale"], cache_dir=cache_dir).get_function("scale")(
        (1,), (4,), (x, np.float32(2), 4))
    return x


def _library_entry(cache_dir: Path) -> Path:
    (entry,) = cache_dir.glob("*.entry")
    return entry


def _planted_library(tmp_path: Path, marker: Path) -> bytes:
    source = tmp_path / "planted.c"
    source.write_text(PLANTED)
    out = tmp_path / "planted.so"
    from rnnc.backends.cuda.emulate import find_cxx

    subprocess.run([find_cxx(), "-x", "c++", "-shared", "-fPIC", f'-DMARKER="{marker}"',
                    str(source), "-o", str(out)], check=True)
    return out.read_bytes()


@needs_cxx
@pytest.mark.parametrize("how", ["raw library as the entry", "library under the old name",
                                 "entry re-checksummed without the secret"])
def test_planted_emulation_library_never_runs(tmp_path: Path, how: str) -> None:
    from rnnc.backends.cuda import emulate

    cache_dir = tmp_path / "cache"
    np.testing.assert_array_equal(_scale(cache_dir), [0, 2, 4, 6])
    marker = tmp_path / "marker"
    planted = _planted_library(tmp_path, marker)
    entry = _library_entry(cache_dir)
    if how == "raw library as the entry":
        entry.write_bytes(planted)
    elif how == "library under the old name":
        # Where rnnc used to look for this library, and dlopen whatever it found.
        cxx = emulate.find_cxx()
        params = emulate.parse_kernels(KERNEL)
        cpp = (f'#include "shim.h"\n#line 1 "kernels.cu"\n{KERNEL}\n#line 1 "launchers.cpp"\n'
               + emulate.launcher_source("scale", params["scale"]))
        old_key = hashlib.sha256("\0".join([emulate.compiler_identity(cxx),
                                            " ".join(emulate.CXX_FLAGS),
                                            emulate.SHIM_PATH.read_text(), cpp]).encode())
        (cache_dir / f"kernels-{old_key.hexdigest()[:24]}.so").write_bytes(planted)
    else:
        (length,) = struct.unpack_from("<I", entry.read_bytes(), len(diskcache.MAGIC))
        start = len(diskcache.MAGIC) + 4
        header = json.loads(entry.read_bytes()[start:start + length])
        header.update(payload_bytes=len(planted),
                      payload_sha256=hashlib.sha256(planted).hexdigest())
        body = _body(json.dumps(header, sort_keys=True).encode(), planted)
        entry.write_bytes(body + hashlib.sha256(body).digest())
    np.testing.assert_array_equal(_scale(cache_dir), [0, 2, 4, 6])
    assert not marker.exists()


_TRUNCATED = """
import sys
import numpy as np
from pathlib import Path
from rnnc.backends.cuda.emulate import EmulatedModule
x = np.arange(4, dtype=np.float32)
EmulatedModule(sys.argv[1], ["scale"], cache_dir=Path(sys.argv[2])).get_function("scale")(
    (1,), (4,), (x, np.float32(2), 4))
assert x.tolist() == [0, 2, 4, 6], x
"""


@needs_cxx
def test_truncated_emulation_library_is_rebuilt(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    _scale(cache_dir)
    entry = _library_entry(cache_dir)
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    # In a child: loading a truncated library can kill a process with SIGBUS.
    result = subprocess.run([sys.executable, "-c", _TRUNCATED, KERNEL, str(cache_dir)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert _library_entry(cache_dir).stat().st_size > entry.stat().st_size // 2 + 100


@needs_cxx
def test_swapped_emulation_library_is_rejected(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    _scale(cache_dir)
    first = _library_entry(cache_dir)
    np.testing.assert_array_equal(_scale(cache_dir, OTHER_KERNEL), [2, 3, 4, 5])
    (second,) = set(cache_dir.glob("*.entry")) - {first}
    shutil.copy(second, first)  # the other kernel's valid library under this key
    np.testing.assert_array_equal(_scale(cache_dir), [0, 2, 4, 6])


@needs_cxx
def test_no_shared_temporary_directory_fallback(tmp_path: Path, monkeypatch) -> None:
    """With no usable cache directory, emulation keeps nothing on disk (one warning), and
    never falls back to a directory under $TMPDIR that anyone could have made."""
    import tempfile

    (tmp_path / "file").write_text("")
    for variable in ("RNNC_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.setenv(variable, str(tmp_path / "file" / "below"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    from rnnc.backends.cuda.emulate import EmulatedModule

    with pytest.warns(diskcache.CacheWarning):
        module = EmulatedModule(KERNEL, ["scale"])
    x = np.ones(3, np.float32)
    module.get_function("scale")((1,), (3,), (x, np.float32(3), 3))
    assert x.tolist() == [3, 3, 3]
    assert list((tmp_path / "tmp").iterdir()) == []


@needs_cxx
def test_emulation_library_is_reused(tmp_path: Path, monkeypatch) -> None:
    from rnnc.backends.cuda import emulate

    cache_dir = tmp_path / "cache"
    _scale(cache_dir)

    def fail(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(emulate, "compile_library", fail)
    np.testing.assert_array_equal(_scale(cache_dir), [0, 2, 4, 6])


def test_emulation_key_covers_flags_shim_and_source(monkeypatch) -> None:
    from rnnc.backends.cuda import emulate

    base = emulate.library_key("g++", "int x;")
    assert emulate.library_key("g++", "int y;") != base
    monkeypatch.setattr(emulate, "CXX_FLAGS", (*emulate.CXX_FLAGS, "-ffast-math"))
    assert emulate.library_key("g++", "int x;") != base
    monkeypatch.undo()
    monkeypatch.setattr(emulate, "SHIM_PATH", Path(__file__))  # another header
    assert emulate.library_key("g++", "int x;") != base


# -- processes and threads

def _fork_program():
    return rnnc.compile(rnnc.cells.lstm(16, 32), backend="numpy").program()


def _fork_and_wait(target, *args) -> tuple[multiprocessing.Process, bool]:
    """Fork a child running ``target(*args)``; wait up to 120 s, killing it if still alive.
    Returns the child and whether it was still alive (blocked)."""
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    child.start()
    child.join(120)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join()
    return child, alive


def _fork_child(root: str) -> None:
    runner = LlvmBackend(cache_dir=Path(root)).build(_fork_program(), "inference")
    env = {name: np.full(shape, 0.1, np.float32) for name, shape in
           ((n, tuple(4 if d == "T" else 2 if d == "B" else d for d in s))
            for n, s in runner.plan.args)}
    if not np.isfinite(runner(env, {"T": 4, "B": 2})["y"]).all():
        raise SystemExit(3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("where", ["between LLVM calls", "inside an LLVM call"])
def test_fork_while_another_thread_compiles(tmp_path: Path, monkeypatch, where: str) -> None:
    parent = os.getpid()
    compiling = threading.Event()
    release = threading.Event()
    real_compile = cache.compile_ir

    def compile_ir(text: str) -> bytes:
        if os.getpid() == parent:
            compiling.set()
            if where == "between LLVM calls":
                release.wait(120)  # the build stays open while the parent forks
        return real_compile(text)

    monkeypatch.setattr(cache, "compile_ir", compile_ir)
    root = tmp_path / "cache"
    cache._CACHES.pop(root, None)
    program = _fork_program()
    builder = threading.Thread(
        target=lambda: LlvmBackend(cache_dir=root).build(program, "inference"))
    builder.start()
    try:
        assert compiling.wait(120)
        if where == "inside an LLVM call":
            time.sleep(0.2)  # into the optimization passes
        child, alive = _fork_and_wait(_fork_child, str(root))
    finally:
        release.set()
        builder.join(120)
    assert not alive, "the forked child blocked"
    assert child.exitcode == 0


_SHARED: dict = {}


def _shared_function_child() -> None:
    fn = _SHARED["fn"]
    x = np.full((3, 2, 16), 0.1, np.float32)
    ys, _ = fn(x, fn.cell.init_params(seed=0))
    if not np.isfinite(ys["y"]).all():
        raise SystemExit(3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_fork_while_the_same_function_compiles(monkeypatch) -> None:
    """A child forked while a thread compiles for one Function calls that Function itself."""
    parent = os.getpid()
    compiling = threading.Event()
    release = threading.Event()
    real_compile = cache.compile_ir

    def compile_ir(text: str) -> bytes:
        if os.getpid() == parent:
            compiling.set()
            release.wait(120)
        return real_compile(text)

    monkeypatch.setattr(cache, "compile_ir", compile_ir)
    fn = rnnc.compile(rnnc.cells.gru(16, 24), backend="llvm", cache_dir=False)
    _SHARED["fn"] = fn
    x = np.zeros((3, 2, 16), np.float32)
    caller = threading.Thread(target=lambda: fn(x, fn.cell.init_params(seed=0)))
    caller.start()
    try:
        assert compiling.wait(120)
        child, alive = _fork_and_wait(_shared_function_child)
    finally:
        release.set()
        caller.join(120)
        _SHARED.clear()
    assert not alive, "the forked child blocked on the Function's lock"
    assert child.exitcode == 0


def _spawn_child(root: str, queue) -> None:
    program = rnnc.compile(rnnc.cells.rnn(2, 3), backend="numpy").program()
    runner = LlvmBackend(cache_dir=Path(root)).build(program, "inference")
    queue.put(_run_rnn(runner))


def _run_rnn(runner) -> np.ndarray:
    env = {"x": np.full((3, 2, 2), 0.5, np.float32), "h": np.zeros((2, 3), np.float32),
           **rnnc.cells.rnn(2, 3).init_params(seed=1)}
    return runner(env, {"T": 3, "B": 2})["y"]


def test_spawn_child_after_the_backend_ran(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache._CACHES.pop(root, None)
    here = _run_rnn(LlvmBackend(cache_dir=root).build(rnnc.compile(rnnc.cells.rnn(2, 3),
                                                                   backend="numpy")
                                                       .program(), "inference"))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_spawn_child, args=(str(root), queue))
    child.start()
    there = queue.get(timeout=300)
    child.join(60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(there, here)


# -- bounded memory

def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _compile_and_drop(count: int, limit_mb: float, root: Path | bool) -> cache.CodeCache:
    x = np.ones((2, 1, 2), np.float32)
    found = None
    for k in range(count):
        fn = rnnc.compile(_cell(k), backend="llvm", cache_dir=root, code_cache_mb=limit_mb)
        fn(x, {"W": np.ones((2, 3), np.float32)})
        found = fn.backend.cache
        assert found.bytes <= found.limit == int(limit_mb * 2**20)
        assert found.bytes == sum(c.nbytes for c in found._memory.values())
        del fn
    return found


def test_memory_cache_stays_within_its_bound(tmp_path: Path) -> None:
    found = _compile_and_drop(10, 0.2, tmp_path)
    assert 0 < len(found._memory) < 10


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts Linux's mappings")
def test_memory_cache_keeps_a_bounded_number_of_programs(tmp_path: Path, monkeypatch) -> None:
    """Small programs fit the bytes bound by the thousand, but each loaded program maps its
    sections (about three mappings) and LLVM aborts the process when Linux refuses one more
    (vm.max_map_count, 65530): the cache also bounds how many programs it keeps."""
    from rnnc import process

    monkeypatch.setattr(process, "CODE_CACHE_PROGRAMS", 4)
    found = _compile_and_drop(2, 64, tmp_path)  # warm: imports, target machine, BLAS
    before = _mappings()
    found = _compile_and_drop(30, 64, tmp_path)
    assert len(found._memory) == 4
    # Without the count bound every one of the 30 stays loaded: about 90 more mappings.
    assert _mappings() - before < 30


@pytest.mark.slow
def test_two_hundred_cells_compiled_and_dropped(monkeypatch) -> None:
    shared = cache.code_cache(None)
    before_limit = shared.limit
    _compile_and_drop(3, 1, False)  # warm up: imports, target machine, BLAS
    rss = _rss_mib()
    try:
        found = _compile_and_drop(200, 1, False)
        assert found is shared and found.bytes <= 1 << 20
        # RSS only loosely: LLVM's pass pipeline keeps about 0.2 MiB per compile inside
        # llvmlite (measured: ~45 MiB for these 200), and up to 128 optimized programs stay
        # cached; before the bound the process grew by ~0.7 MiB per cell (~145 MiB).
        assert _rss_mib() - rss < 100
    finally:
        shared.set_limit(before_limit)


# -- thread counts

@pytest.mark.parametrize("value", ["0", "-1", "four", "²", "10000", "1" * 20, "2.5"])
def test_bad_rnnc_threads_is_an_rnnc_error(monkeypatch, value: str) -> None:
    monkeypatch.setenv("RNNC_THREADS", value)
    with pytest.raises(rnnc.RnncError, match="RNNC_THREADS"):
        LlvmBackend(cache_dir=False)


def test_thread_counts_in_range_are_accepted(monkeypatch) -> None:
    MAX_THREADS = LlvmSchedule.MAX_THREADS  # noqa: N806
    monkeypatch.setenv("RNNC_THREADS", " 2 ")
    assert LlvmBackend(cache_dir=False).threads == 2
    monkeypatch.delenv("RNNC_THREADS")
    assert LlvmBackend(cache_dir=False, threads=MAX_THREADS).threads == MAX_THREADS
    for bad in (0, -1, MAX_THREADS + 1, 2.0, "2", True):
        with pytest.raises(rnnc.RnncError, match="threads"):
            LlvmBackend(cache_dir=False, threads=bad)
