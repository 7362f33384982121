"""Compile LLVM IR to object code for the host CPU, cached in memory and on disk.

The key hashes the printed program, its dtype, the BLAS calling convention, the host CPU name
and features, the rnnc and LLVM versions and the source of this backend (so an edited code
generator never loads stale code). A disk entry is ``MAGIC``, the SHA-256 of the payload, the
payload's length and the payload (the buffer plan as JSON, then the object code); an entry
whose checksum or length does not match is deleted and rebuilt. Object code is loaded into an
MCJIT engine with ``add_object_file``, the same path whether it was just compiled or read back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from rnnc.backends.llvm.codegen import ENTRY, Plan

MAGIC = b"RNNC-LLVM-OBJ-1\n"
_HEADER = struct.Struct("<32sQ")
_SOURCES = ("cache.py", "codegen.py", "kernels.py", "rules.py", "mathlib.py")


def _new_target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, reloc="pic", codemodel="default")


@cache
def target_machine() -> llvm.TargetMachine:
    """The host CPU's target machine at opt level 3, for compiling (never given away)."""
    return _new_target_machine()


@cache
def _environment_key() -> str:
    import rnnc

    here = Path(__file__).parent
    source = hashlib.sha256()
    for name in _SOURCES:
        source.update((here / name).read_bytes())
    return "\n".join([llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                      llvm.get_process_triple(), rnnc.__version__, llvmlite.__version__,
                      ".".join(map(str, llvm.llvm_version_info)), source.hexdigest()])


def key(program_text: str, dtype: str, convention: str) -> str:
    """The cache key of one program."""
    parts = [program_text, dtype, convention, _environment_key()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@cache
def _data_layout() -> str:
    return str(target_machine().target_data)


def optimize(text: str) -> llvm.ModuleRef:
    """Parse ``text`` and optimize it at O3 for the host, with both vectorizers on."""
    tm = target_machine()
    module = llvm.parse_assembly(text)
    module.triple = tm.triple
    module.data_layout = _data_layout()
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(module, builder)
    return module


def compile_ir(text: str) -> bytes:
    """Host object code for LLVM IR ``text``."""
    return target_machine().emit_object(optimize(text))


@dataclasses.dataclass
class Compiled:
    """Loaded native code: the engine that owns it, the entry address and the buffer plan."""

    engine: llvm.ExecutionEngine
    address: int
    plan: Plan
    cached: str  # "memory", "disk" or "no"


def load(obj: bytes, plan: Plan, cached: str) -> Compiled:
    """Load object code into a fresh MCJIT engine and find ``rnnc_run``."""
    tm = _new_target_machine()  # the engine takes ownership of its target machine
    empty = llvm.parse_assembly("")
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    address = engine.get_function_address(ENTRY)
    if not address:
        raise RuntimeError(f"object code has no {ENTRY}")
    return Compiled(engine, address, plan, cached)


def _encode(plan: Plan, obj: bytes) -> bytes:
    meta = json.dumps(dataclasses.asdict(plan)).encode()
    payload = struct.pack("<Q", len(meta)) + meta + obj
    return MAGIC + _HEADER.pack(hashlib.sha256(payload).digest(), len(payload)) + payload


def _decode(data: bytes) -> tuple[Plan, bytes] | None:
    """The plan and object code of a disk entry, or None if it is damaged."""
    start = len(MAGIC) + _HEADER.size
    if len(data) < start or not data.startswith(MAGIC):
        return None
    digest, length = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[start:]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        return None
    (meta_len,) = struct.unpack_from("<Q", payload)
    meta = json.loads(payload[8:8 + meta_len])
    plan = Plan(meta["dtype"], tuple((n, tuple(s)) for n, s in meta["args"]),
                tuple((n, tuple(s)) for n, s in meta["results"]),
                [tuple(s) for s in meta["slots"]],
                [(bool(ta), bool(tb), tuple(tuple(d) for d in sizes))
                 for ta, tb, sizes in meta["gemms"]])
    return plan, payload[8 + meta_len:]


class CodeCache:
    """Compiled programs by key: in memory for this process, and on disk under ``root``."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._memory: dict[str, Compiled] = {}
        self._lock = threading.Lock()

    def path(self, k: str) -> Path | None:
        return None if self.root is None else self.root / f"{k}.o"

    def get(self, k: str, build: Callable[[], tuple[str, Plan]]) -> Compiled:
        """The loaded code for key ``k``; ``build()`` gives IR text and plan on a miss."""
        with self._lock:
            if k in self._memory:
                return dataclasses.replace(self._memory[k], cached="memory")
            compiled = self._from_disk(k)
            if compiled is None:
                text, plan = build()
                obj = compile_ir(text)
                self._to_disk(k, plan, obj)
                compiled = load(obj, plan, "no")
            self._memory[k] = compiled
            return compiled

    def _from_disk(self, k: str) -> Compiled | None:
        path = self.path(k)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError:
            return None
        decoded = _decode(data)
        if decoded is None:
            # A truncated or corrupted entry (a crash mid-write by an older version, a full
            # disk, bit rot): remove it so that the rebuilt entry replaces it.
            path.unlink(missing_ok=True)
            return None
        return load(decoded[1], decoded[0], "disk")

    def _to_disk(self, k: str, plan: Plan, obj: bytes) -> None:
        path = self.path(k)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(_encode(plan, obj))
            os.replace(tmp, path)  # readers see the old entry or the whole new one
        except OSError:
            pass  # an unwritable cache only costs compiling again


_CACHES: dict[Path | None, CodeCache] = {}
_CACHES_LOCK = threading.Lock()


def code_cache(root: Path | None) -> CodeCache:
    """The process-wide cache for one directory (None: memory only)."""
    with _CACHES_LOCK:
        if root not in _CACHES:
            _CACHES[root] = CodeCache(root)
        return _CACHES[root]
