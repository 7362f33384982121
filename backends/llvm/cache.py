"""Compile LLVM IR to object code for the host CPU, cached in memory and on disk.

The key hashes the program's structural fingerprint (:mod:`rnnc.fingerprint`), its dtype, the
BLAS calling convention, the host CPU name and features, the rnnc, llvmlite and LLVM versions
and every source file of rnnc (so an edited code generator, anywhere, never loads stale code).

On disk, an entry is a :class:`rnnc.diskcache.DiskCache` entry under ``<cache_dir>/llvm``:
the object code, with the buffer plan as metadata, checked against the request's key and
fingerprint and authenticated by the directory's secret; a plan that does not fit the
requested program (its arguments and results, well-formed slot and GEMM shapes) is rejected
too. Any entry that fails a check is deleted and rebuilt.

In memory, loaded code is kept in a least-recently-used map bounded by bytes
(:data:`DEFAULT_MEMORY_BYTES`). Eviction drops only the cache's reference: a runner holds its
own, so an engine is freed once nothing can call it.

Each module is optimized and emitted in a forked child where possible (:mod:`.isolated`), so
that the memory LLVM's pipeline keeps does not pile up in the process.

Compiling never holds the cache's lock: a second thread asking for the same key waits for the
first one's result, and other keys compile meanwhile. A forked child gets fresh locks
(:mod:`rnnc.process`), and ``fork()`` waits for llvmlite's current call (llvmlite serialises
every LLVM call under one lock), so a child forked while another thread compiles finds LLVM
idle and compiles itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm
from llvmlite.binding import ffi

from rnnc import diskcache, process
from rnnc.backends.llvm import isolated
from rnnc.backends.llvm.codegen import env_shapes
from rnnc.backends.llvm.context import ENTRY, Plan
from rnnc.ir import Program

DEFAULT_MEMORY_BYTES = process.CODE_CACHE_MB << 20
# What one loaded MCJIT engine costs besides its object code (measured: 30 to 60 KiB).
ENGINE_BYTES = 64 << 10
_MAX_DIM = 1 << 40


def _new_target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, reloc="pic", codemodel="default")


@cache
def target_machine() -> llvm.TargetMachine:
    """The host CPU's target machine at opt level 3, for compiling (never given away).

    First use also caps LLVM's loop peeling at 0 iterations, for the whole process: LLVM 22
    (llvmlite 0.50) aborts the process on some loops whose last iteration it decides to peel
    (an assertion in ``LoopPeel.cpp``; the slow fuzz found one, seed 4469, kept as a test in
    ``tests/backends/test_llvm_peeling.py``). rnnc's loops gain nothing from peeling. The
    option is global to LLVM, so other users of llvmlite in the process (numba) see it too."""
    llvm.set_option("rnnc", "-unroll-peel-max-count=0")
    return _new_target_machine()


def generator_sources() -> list[Path]:
    """Every source file of the installed rnnc (core, passes, backends), in a fixed order.

    All of them, not a hand-kept list: the LLVM backend's code generators (``codegen``,
    ``context``, ``region``, ``kernels``, ``rules``, ``mathlib``, ``gemm``) import rnnc's core
    modules, and a list would miss the next file that starts emitting IR."""
    import rnnc
    import rnnc.backends
    import rnnc.passes

    roots = {Path(p).resolve() for m in (rnnc, rnnc.passes, rnnc.backends) for p in m.__path__}
    return sorted({f for root in roots for f in root.rglob("*.py")})


@cache
def _environment_key() -> str:
    import rnnc

    source = hashlib.sha256()
    for path in generator_sources():
        data = path.read_bytes()
        source.update(f"{path.name}\0{len(data)}\0".encode() + data)
    from rnnc.backends.llvm import bf16  # the bf16 kernel tier: AMX needs the kernel's grant

    return "\n".join([llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                      bf16.host_tier(),
                      llvm.get_process_triple(), rnnc.__version__, llvmlite.__version__,
                      ".".join(map(str, llvm.llvm_version_info)), source.hexdigest()])


def key(fingerprint: str, dtype: str, convention: str, schedule: str = "") -> str:
    """The cache key of the program with structural ``fingerprint`` (hex SHA-256), built as
    ``schedule`` says (``Schedule.key()`` and the build: every choice compiled in)."""
    parts = [fingerprint, dtype, convention, schedule, _environment_key()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@cache
def _data_layout() -> str:
    return str(target_machine().target_data)


def optimize(text: str, context: llvm.ContextRef | None = None) -> llvm.ModuleRef:
    """Parse ``text`` and optimize it at O3 for the host, with both vectorizers on."""
    tm = target_machine()
    module = llvm.parse_assembly(text, context)
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
    """Host object code for LLVM IR ``text``, compiled in a forked child where possible: the
    memory LLVM's optimization pipeline keeps goes away with the child (:mod:`.isolated`)."""
    target_machine()  # made once, here: every child inherits it
    obj = isolated.run(compile_here, text)
    return obj if obj is not None else compile_here(text)


def compile_here(text: str) -> bytes:
    """Host object code for LLVM IR ``text``, compiled in this process."""
    # A context of its own: what LLVM interns while compiling (types, constants) is freed
    # with the module instead of piling up in the global context.
    return target_machine().emit_object(optimize(text, llvm.create_context()))


@dataclasses.dataclass
class Compiled:
    """Loaded native code: the engine that owns it, the entry address and the buffer plan."""

    engine: llvm.ExecutionEngine
    address: int
    plan: Plan
    cached: str  # "memory", "disk" or "no"
    nbytes: int = 0  # what the memory cache counts for it


def load(obj: bytes, plan: Plan, cached: str) -> Compiled:
    """Load object code into a fresh MCJIT engine and find ``rnnc_run``."""
    tm = _new_target_machine()  # the engine takes ownership of its target machine
    empty = llvm.parse_assembly("", llvm.create_context())  # the module keeps its context
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    address = engine.get_function_address(ENTRY)
    if not address:
        raise RuntimeError(f"object code has no {ENTRY}")
    return Compiled(engine, address, plan, cached, len(obj) + ENGINE_BYTES)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready metadata of a disk entry."""
    return dataclasses.asdict(plan)


def _dims(value: Any) -> tuple | None:
    """A shape read back from JSON, or None unless every dim is T, B or a sane size."""
    if not isinstance(value, list | tuple):
        return None
    ok = all(d in ("T", "B") or (type(d) is int and 0 <= d < _MAX_DIM) for d in value)
    return tuple(value) if ok else None


def plan_from_json(meta: Any) -> Plan | None:
    """The plan recorded in a disk entry, or None if it is malformed (never raises)."""
    try:
        named = [[(n, _dims(s)) for n, s in meta[part]] for part in ("args", "results")]
        slots = [_dims(s) for s in meta["slots"]]
        gemms = [(ta, tb, tuple(_dims(d) for d in sizes)) for ta, tb, sizes in meta["gemms"]]
        dtype = meta["dtype"]
    except (TypeError, KeyError, ValueError):
        return None
    shapes = [s for part in named for _, s in part] + slots + [d for g in gemms for d in g[2]]
    if any(s is None for s in shapes) or not all(
            type(ta) is bool and type(tb) is bool and len(sizes) == 3 for ta, tb, sizes in gemms):
        return None
    return Plan(dtype, tuple(named[0]), tuple(named[1]), slots, gemms)


def plan_fits(plan: Plan, program: Program) -> bool:
    """Whether ``plan`` has the buffers the runner passes for ``program``: its dtype, and
    its arguments and results in order with their shapes."""
    shapes = env_shapes(program)
    return (plan.dtype == program.dtype
            and plan.args == tuple((n, tuple(t.shape)) for n, (_, t) in program.args.items())
            and plan.results == tuple((n, tuple(shapes[n])) for n in program.results))


class _Build:
    """A compile in progress; threads asking for the same key wait for its result."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Compiled | None = None


class CodeCache:
    """Compiled programs by key: in memory for this process (an LRU bounded by ``limit``
    bytes and ``process.CODE_CACHE_PROGRAMS`` programs), and on disk under ``root/llvm``
    (``root`` None: memory only)."""

    def __init__(self, root: Path | None, limit: int = DEFAULT_MEMORY_BYTES) -> None:
        self.root = root
        self.disk = diskcache.DiskCache(root, "llvm-object", "llvm")
        self.limit = limit
        self.bytes = 0
        self._memory: OrderedDict[str, Compiled] = OrderedDict()
        self._lock = process.Lock()
        self._building: dict[str, _Build] = {}

    def path(self, k: str) -> Path | None:
        """Where the disk entry for key ``k`` lives."""
        return self.disk.path(k)

    def set_limit(self, limit: int) -> None:
        """Bound the memory cache to ``limit`` bytes, evicting the least recently used."""
        with self._lock:
            self.limit = limit
            self._evict()

    def get(self, k: str, fingerprint: str, build: Callable[[], tuple[str, Plan]],
            fits: Callable[[Plan], bool] = lambda plan: True) -> Compiled:
        """The loaded code for key ``k``; ``build()`` gives IR text and plan on a miss, and a
        plan read from disk is used only if ``fits(plan)``."""
        while True:
            with self._lock:
                hit = self._memory.get(k)
                if hit is not None:
                    self._memory.move_to_end(k)
                    return dataclasses.replace(hit, cached="memory")
                pending = self._building.get(k)
                if pending is None:
                    pending = self._building[k] = _Build()
                    break
            pending.done.wait()
            if pending.result is not None:
                return dataclasses.replace(pending.result, cached="memory")
            # The other thread's build failed: build here, and raise its error if it recurs.
        try:
            compiled = self._from_disk(k, fingerprint, fits) or \
                self._compile(k, fingerprint, build)
            pending.result = compiled
            with self._lock:
                self._insert(k, compiled)
            return compiled
        finally:
            with self._lock:
                if self._building.get(k) is pending:
                    del self._building[k]
            pending.done.set()

    def _insert(self, k: str, compiled: Compiled) -> None:
        old = self._memory.pop(k, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._memory[k] = compiled
        self.bytes += compiled.nbytes
        self._evict()

    def _evict(self) -> None:
        # An entry larger than the whole bound is not kept either; nor more programs than
        # process.CODE_CACHE_PROGRAMS (each holds memory mappings, which a process has few of).
        while (self.bytes > self.limit or len(self._memory) > process.CODE_CACHE_PROGRAMS) \
                and self._memory:
            _, dropped = self._memory.popitem(last=False)
            self.bytes -= dropped.nbytes

    def _compile(self, k: str, fingerprint: str, build: Callable[[], tuple[str, Plan]]
                 ) -> Compiled:
        text, plan = build()
        obj = compile_ir(text)
        self.disk.store(k, fingerprint, {"plan": plan_to_json(plan)}, obj)
        return load(obj, plan, "no")

    def _from_disk(self, k: str, fingerprint: str, fits: Callable[[Plan], bool]
                   ) -> Compiled | None:
        entry = self.disk.load(k, fingerprint)
        if entry is None:
            return None
        plan = plan_from_json(entry.meta.get("plan"))
        if plan is None or not fits(plan):
            self.disk.discard(k)
            return None
        try:
            return load(entry.payload, plan, "disk")
        except (RuntimeError, OSError, ValueError):
            self.disk.discard(k)  # e.g. LLVM cannot load it after all: compile again
            return None


# Least recently used first out beyond process.CODE_CACHE_DIRECTORIES.
_CACHES: dict[Path | None, CodeCache] = {}
_CACHES_LOCK = process.Lock()


def code_cache(root: Path | None, limit: int | None = None) -> CodeCache:
    """The process-wide cache for one cache directory (None: memory only); ``limit`` (bytes)
    rebounds its memory part when given."""
    with _CACHES_LOCK:
        found = _CACHES.pop(root, None)
        _CACHES[root] = found = CodeCache(root) if found is None else found  # most recent
        while len(_CACHES) > max(1, process.CODE_CACHE_DIRECTORIES):
            del _CACHES[next(iter(_CACHES))]
    if limit is not None:
        found.set_limit(limit)
    return found


def _llvmlite_lock() -> Any:
    """llvmlite's lock around every LLVM call (private to llvmlite; None if it moved)."""
    lock = getattr(getattr(getattr(ffi, "lib", None), "_lock", None), "_lock", None)
    return lock if hasattr(lock, "acquire") and hasattr(lock, "release") else None


def _before_fork() -> None:
    lock = _llvmlite_lock()
    if lock is not None:
        lock.acquire()  # wait for the LLVM call in flight: the child must not inherit it


def _after_fork_in_parent() -> None:
    lock = _llvmlite_lock()
    if lock is not None:
        lock.release()


def _after_fork_in_child() -> None:
    _after_fork_in_parent()
    for found in _CACHES.values():
        # Builds in flight belong to threads the child does not have (the locks are fresh).
        found._building = {}


process.at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child)
