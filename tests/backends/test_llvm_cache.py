"""The LLVM backend's code cache: disk round trip, damaged entries, keys, program identity,
the in-memory bound."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc import diskcache  # noqa: E402
from rnnc.backends.llvm import autotune, blas, cache  # noqa: E402
from rnnc.backends.llvm.runtime import LlvmBackend  # noqa: E402
from rnnc.fingerprint import fingerprint  # noqa: E402
from rnnc.ir import retype  # noqa: E402


@pytest.fixture(scope="module")
def program():
    return rnnc.compile(rnnc.cells.rnn(2, 3), backend="numpy").program()


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
    (entry,) = (root / "llvm").glob("*.entry")
    return entry


def test_disk_round_trip(tmp_path: Path, program) -> None:
    first = _fresh(tmp_path).build(program, "inference")
    assert first.compiled.cached == "no"
    again = LlvmBackend(cache_dir=tmp_path).build(program, "inference")
    assert again.compiled.cached == "memory"
    loaded = _fresh(tmp_path).build(program, "inference")
    assert loaded.compiled.cached == "disk"
    np.testing.assert_array_equal(_run(loaded), _run(first))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_damaged_entry_is_deleted_and_rebuilt(tmp_path: Path, program, damage: str) -> None:
    expected = _run(_fresh(tmp_path).build(program, "inference"))
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
    rebuilt = _fresh(tmp_path).build(program, "inference")
    assert rebuilt.compiled.cached == "no"
    np.testing.assert_array_equal(_run(rebuilt), expected)
    # the rebuilt entry
    assert _fresh(tmp_path).build(program, "inference").compiled.cached == "disk"


def test_key_depends_on_program_dtype_and_convention(program) -> None:
    ident = fingerprint(program)
    other = fingerprint(rnnc.compile(rnnc.cells.gru(2, 3), backend="numpy").program())
    keys = {cache.key(ident, "f32", "cblas"), cache.key(ident, "f64", "cblas"),
            cache.key(ident, "f32", "fortran"), cache.key(other, "f32", "cblas")}
    assert len(keys) == 4
    assert cache.key(ident, "f32", "cblas") == cache.key(fingerprint(program), "f32", "cblas")


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch, program) -> None:
    monkeypatch.setenv("RNNC_CACHE_DIR", str(tmp_path / "env"))
    cache._CACHES.pop(tmp_path / "env", None)
    LlvmBackend().build(program, "inference")
    assert len(list((tmp_path / "env" / "llvm").glob("*.entry"))) == 1


# -- program identity is structure (issue 11, bug 2)

EPSILONS = (0.1, 0.1000000001)  # equal when printed to 9 significant digits


def _eps_cell(eps: float) -> rnnc.Cell:
    c = rnnc.Cell("eps")
    x = c.input("x", 3)
    h = c.state("h", 4)
    W = c.param("W", (3, 4))
    h_new = x @ W + h * eps
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _eps_inputs() -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 2, 3))
    W = rng.standard_normal((3, 4))
    h0 = 1e9 * (1 + rng.random((2, 4)))  # h * eps then differs in the tenth digit
    return x, {"W": W}, h0


def _eps_reference(eps: float) -> tuple[np.ndarray, np.ndarray]:
    """A float64 NumPy loop, written independently of rnnc."""
    x, params, h = _eps_inputs()
    ys = []
    for t in range(x.shape[0]):
        h = x[t] @ params["W"] + h * eps
        ys.append(h)
    return np.stack(ys), h


def _assert_matches_reference(eps: float, y: np.ndarray, h: np.ndarray) -> None:
    y_ref, h_ref = _eps_reference(eps)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=0)


def test_the_two_epsilons_print_alike_but_give_different_results() -> None:
    # The premise of the identity tests below: text cannot tell the cells apart, results can.
    texts = {rnnc.printer.format_program(_eps_cell(e).program()) for e in EPSILONS}
    assert len(texts) == 1
    assert np.abs(_eps_reference(EPSILONS[0])[1] / _eps_reference(EPSILONS[1])[1] - 1).max() \
        > 1e-10


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
def test_programs_differing_beyond_printed_digits_do_not_share_code(tmp_path: Path,
                                                                    backend: str) -> None:
    options = {"cache_dir": tmp_path} if backend == "llvm" else {}
    x, params, h0 = _eps_inputs()
    for eps in EPSILONS:
        fn = rnnc.compile(_eps_cell(eps), backend=backend, **options)
        ys, states = fn(x, params, states={"h": h0})
        _assert_matches_reference(eps, ys["y"], states["h"])


def test_fingerprint_is_structure_with_exact_constants() -> None:
    from dataclasses import replace

    from rnnc.ir import FUSED

    # Equal programs built twice (different node ids): equal fingerprints, in every mode.
    traced = [rnnc.cells.lstm(3, 4).program() for _ in range(2)]
    for mode in ("inference", "forward", "backward"):
        a, b = (rnnc.passes.run(t, rnnc.passes.pipeline(mode)) for t in traced)
        assert {n.id for n in a.scan.body.nodes()} != {n.id for n in b.scan.body.nodes()}
        assert fingerprint(a) == fingerprint(b)
    # The constant sits inside a fused region of the loop after optimization: still told
    # apart. (The eps cell itself is linear in h, so parallel-scan leaves it no loop; the
    # constant is then the scan's coefficient in pre, told apart as well.)
    def tanh_cell(eps: float) -> rnnc.Cell:
        c = rnnc.Cell("eps")
        x, h = c.input("x", 3), c.state("h", 4)
        h_new = rnnc.tanh(x @ c.param("W", (3, 4)) + h * eps)
        c.update(h=h_new)
        c.output("y", h_new)
        return c

    fused = [rnnc.compile(tanh_cell(e), backend="numpy").program() for e in EPSILONS]
    assert any(n.op is FUSED for n in fused[0].scan.body.nodes())
    assert fingerprint(fused[0]) != fingerprint(fused[1])
    optimized = [rnnc.compile(_eps_cell(e), backend="numpy").program() for e in EPSILONS]
    assert any(n.op.name == "linear_scan" for n in optimized[0].pre.nodes())
    assert fingerprint(optimized[0]) != fingerprint(optimized[1])
    base = optimized[0]
    variants = [retype(base, "f64"), replace(base, cell="other"),
                replace(base, results=tuple(reversed(base.results))),
                replace(base, scan=replace(base.scan, reverse=not base.scan.reverse))]
    assert len({fingerprint(p) for p in [base, *variants]}) == 1 + len(variants)


_SECOND_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import rnnc
    from tests.backends.test_llvm_cache import _eps_cell, _eps_inputs

    eps = float.fromhex(sys.argv[1])
    x, params, h0 = _eps_inputs()
    ys, states = rnnc.compile(_eps_cell(eps), backend="llvm")(x, params, states={"h": h0})
    np.save(sys.argv[2], states["h"])
""")


def test_second_process_with_the_same_cache_gets_its_own_code(tmp_path: Path) -> None:
    env = dict(os.environ, RNNC_CACHE_DIR=str(tmp_path / "cache"))
    root = Path(__file__).parents[2]
    for k, eps in enumerate(EPSILONS):
        out = tmp_path / f"h{k}.npy"
        subprocess.run([sys.executable, "-c", _SECOND_PROCESS, eps.hex(), str(out)], env=env,
                       cwd=root, check=True, timeout=300)
        _, h_ref = _eps_reference(eps)
        np.testing.assert_allclose(np.load(out), h_ref, rtol=1e-12, atol=0)
    assert len(list((tmp_path / "cache" / "llvm").glob("*.entry"))) == 2


# -- the disk key covers every code generator (issue 11, bug 3)

def test_key_covers_every_source_that_generates_code() -> None:
    sources = set(cache.generator_sources())
    llvm_package = Path(cache.__file__).parent
    assert set(llvm_package.glob("*.py")) <= sources  # region.py and gemm.py emit IR too
    core = Path(rnnc.__file__).parent
    assert {core / "ir.py", core / "ops.py", core / "fingerprint.py"} <= sources


def test_editing_a_code_generator_changes_the_key(tmp_path: Path, monkeypatch) -> None:
    copies = []
    for path in cache.generator_sources():
        copy = tmp_path / str(len(copies)) / path.name
        copy.parent.mkdir()
        shutil.copy(path, copy)
        copies.append(copy)
    monkeypatch.setattr(cache, "generator_sources", lambda: copies)
    cache._environment_key.cache_clear()
    before = cache.key("0" * 64, "f32", "cblas")
    (gemm,) = [c for c in copies if c.name == "gemm.py"]
    gemm.write_text(gemm.read_text() + "\n# an edit\n")
    cache._environment_key.cache_clear()
    try:
        assert cache.key("0" * 64, "f32", "cblas") != before
    finally:
        monkeypatch.undo()
        cache._environment_key.cache_clear()


# -- checked entries (issue 19, high 4)

def _eps_program(eps: float):
    return retype(rnnc.compile(_eps_cell(eps), backend="numpy").program(), "f64")


def _eps_run(runner) -> np.ndarray:
    x, params, h0 = _eps_inputs()
    return runner({"x": x, "h": h0, **params}, {"T": 3, "B": 2})["y"]


def test_swapped_entry_is_rejected(tmp_path: Path) -> None:
    """Another program's valid entry renamed to this key is never run."""
    first, second = (_eps_program(e) for e in EPSILONS)
    _fresh(tmp_path).build(first, "inference")
    (entry_first,) = (tmp_path / "llvm").glob("*.entry")
    _fresh(tmp_path).build(second, "inference")
    (entry_second,) = set((tmp_path / "llvm").glob("*.entry")) - {entry_first}
    shutil.copy(entry_second, entry_first)
    runner = _fresh(tmp_path).build(first, "inference")
    assert runner.compiled.cached == "no"
    np.testing.assert_allclose(_eps_run(runner), _eps_reference(EPSILONS[0])[0], rtol=1e-12)


def _split_entry(data: bytes) -> tuple[dict, bytes]:
    import json
    import struct

    start = len(diskcache.MAGIC) + 4
    (length,) = struct.unpack_from("<I", data, len(diskcache.MAGIC))
    return json.loads(data[start:start + length]), data[start + length:-32]


def _rechecksummed(header: dict, payload: bytes) -> bytes:
    """An entry rewritten the way an editor without the directory's secret can: header and
    checksum recomputed, the trailing MAC replaced by a plain SHA-256."""
    import hashlib
    import json
    import struct

    header = dict(header, payload_bytes=len(payload),
                  payload_sha256=hashlib.sha256(payload).hexdigest())
    raw = json.dumps(header, sort_keys=True).encode()
    body = diskcache.MAGIC + struct.pack("<I", len(raw)) + raw + payload
    return body + hashlib.sha256(body).digest()


def test_edited_entry_with_recomputed_checksum_is_rejected(tmp_path: Path) -> None:
    first, second = (_eps_program(e) for e in EPSILONS)
    _fresh(tmp_path).build(first, "inference")
    (entry_first,) = (tmp_path / "llvm").glob("*.entry")
    _fresh(tmp_path).build(second, "inference")
    (entry_second,) = set((tmp_path / "llvm").glob("*.entry")) - {entry_first}
    header, _ = _split_entry(entry_first.read_bytes())
    _, other_code = _split_entry(entry_second.read_bytes())
    entry_first.write_bytes(_rechecksummed(header, other_code))  # this key, other code
    runner = _fresh(tmp_path).build(first, "inference")
    assert runner.compiled.cached == "no"
    np.testing.assert_allclose(_eps_run(runner), _eps_reference(EPSILONS[0])[0], rtol=1e-12)


def _craft(plan: dict, craft: str) -> object:
    if craft == "no slots":
        return {**plan, "slots": []}
    if craft == "renamed argument":
        return {**plan, "args": [["not_" + n, s] for n, s in plan["args"]]}
    if craft == "huge slot":
        return {**plan, "slots": [[1 << 62]] + plan["slots"][1:]}
    return ["not", "a", "plan"]


@pytest.mark.parametrize("signed, craft", [
    (False, "no slots"), (False, "renamed argument"), (False, "huge slot"),
    (False, "not a plan"), (True, "renamed argument"), (True, "huge slot"),
    (True, "not a plan")])
def test_crafted_buffer_plan_is_rejected_without_running(tmp_path: Path, program, signed: bool,
                                                         craft: str) -> None:
    """A crafted plan never reaches native code: without the directory's secret the entry
    fails its MAC; even signed (what a buggy writer could produce), a plan runs only if it
    decodes and has exactly the buffers the runner passes for the requested program. (A
    signed plan is otherwise the one codegen made for this key: the key covers the program,
    the calling convention and every code generator.)"""
    backend = _fresh(tmp_path)
    expected = _run(backend.build(program, "inference"))
    entry = _entry(tmp_path)
    header, obj = _split_entry(entry.read_bytes())
    plan = _craft(header["meta"]["plan"], craft)
    if signed:
        assert backend.cache.disk.store(header["key"], header["fingerprint"], {"plan": plan}, obj)
    else:
        entry.write_bytes(_rechecksummed(dict(header, meta={"plan": plan}), obj))
    runner = _fresh(tmp_path).build(program, "inference")
    assert runner.compiled.cached == "no"
    np.testing.assert_array_equal(_run(runner), expected)


def test_plan_from_json_never_raises() -> None:
    good = cache.plan_to_json(cache.Plan("f32", (("x", ("T", "B", 2)),), (("y", ("T", "B", 3)),),
                                         [("B", 3)], [(False, False, (("B",), (3,), (2,)))]))
    assert cache.plan_from_json(good) is not None
    bad = [None, 1, "plan", [], {}, {**good, "slots": [[-1]]}, {**good, "slots": [["Q"]]},
           {**good, "gemms": [[1, 0, [[1], [1], [1]]]]}, {**good, "gemms": [[True, True, []]]},
           {**good, "args": [["x"]]}, {**good, "args": 5}, {**good, "slots": [[1.5]]}]
    for meta in bad:
        assert cache.plan_from_json(meta) is None, meta


# -- the in-memory cache is bounded (issue 19, deliver 4)

def _scaled_rnn(k: int) -> rnnc.Cell:
    c = rnnc.Cell(f"scaled{k}")
    x = c.input("x", 2)
    h = c.state("h", 3)
    W = c.param("W", (2, 3))
    h_new = rnnc.tanh(x @ W + h * (0.5 + k / 64))
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def test_memory_cache_is_a_bounded_lru(tmp_path: Path) -> None:
    programs = [rnnc.compile(_scaled_rnn(k), backend="numpy").program() for k in range(4)]
    backend = _fresh(tmp_path)
    runners = [backend.build(p, "inference") for p in programs[:2]]
    sizes = sorted(c.nbytes for c in backend.cache._memory.values())
    backend.cache.set_limit(sum(sizes) + sizes[0] // 2)  # two entries, not three
    # now most recently used
    assert backend.build(programs[0], "inference").compiled.cached == "memory"
    backend.build(programs[2], "inference")  # evicts programs[1], the least recently used
    assert backend.cache.bytes <= backend.cache.limit
    assert backend.build(programs[0], "inference").compiled.cached == "memory"
    assert backend.build(programs[1], "inference").compiled.cached == "disk"
    # A runner whose code left the cache keeps its own engine and still runs.
    env = {"x": np.ones((2, 1, 2), np.float32), "h": np.zeros((1, 3), np.float32),
           "W": np.ones((2, 3), np.float32)}
    assert np.isfinite(runners[1](env, {"T": 2, "B": 1})["y"]).all()
    backend.cache.set_limit(0)
    assert backend.cache.bytes == 0 and not backend.cache._memory


def test_memory_bound_option_and_environment(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "a"
    cache._CACHES.pop(root, None)
    assert LlvmBackend(cache_dir=root, code_cache_mb=3).cache.limit == 3 << 20
    monkeypatch.setenv("RNNC_CODE_CACHE_MB", "0.5")
    assert LlvmBackend(cache_dir=root).cache.limit == 1 << 19
    assert cache.CodeCache(None).limit == cache.DEFAULT_MEMORY_BYTES == 256 << 20
    for bad in ("-1", "lots", "nan", "inf"):
        monkeypatch.setenv("RNNC_CODE_CACHE_MB", bad)
        with pytest.raises(rnnc.RnncError, match="RNNC_CODE_CACHE_MB"):
            LlvmBackend(cache_dir=root)
    monkeypatch.delenv("RNNC_CODE_CACHE_MB")
    for bad in (-1, "8", True, float("nan")):
        with pytest.raises(rnnc.RnncError, match="code_cache_mb"):
            LlvmBackend(cache_dir=root, code_cache_mb=bad)


# -- every cache honours the one setting (issue 11 deliver 4, issue 19 medium)

def test_tuning_file_follows_the_cache_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RNNC_CACHE_DIR", str(tmp_path / "env"))
    assert autotune._default_cache_dir() == tmp_path / "env"
    library = blas.get()
    twin = blas.Blas("twin", library.sgemm_addr, library.dgemm_addr, library.convention,
                     library.set_threads, library.threads_addr)
    monkeypatch.setattr(blas, "_load", {library.name: library, "twin": twin}.get)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    backend = _fresh(tmp_path / "explicit")
    backend.libraries = [library, twin]
    program = rnnc.compile(rnnc.cells.rnn(8, 16), backend="numpy").program()
    runner = backend.build(program, "inference")
    runner.gemm_choice(64, 32)
    assert (tmp_path / "explicit" / "blas.json").is_file()
    assert not (tmp_path / "env" / "blas.json").exists()


def test_tests_use_a_private_cache_directory(private_cache_dir: Path) -> None:
    root = Path(os.environ["RNNC_CACHE_DIR"])
    assert root == private_cache_dir and not root.is_relative_to(Path.home() / ".cache")
    assert diskcache.default_root() == root
    assert autotune._default_cache_dir() == root
    assert LlvmBackend().cache.disk.directory == root / "llvm"


def test_cache_dir_of_the_wrong_kind_is_an_rnnc_error() -> None:
    with pytest.raises(rnnc.RnncError, match="cache_dir"):
        LlvmBackend(cache_dir=123)
