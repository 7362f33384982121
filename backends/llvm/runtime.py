"""The LLVM backend: compile a program to native code once, then one native call per sequence.

Options (the only place that reads environment variables):

- ``blas``: a library name of :mod:`rnnc.backends.llvm.blas` (default ``$RNNC_BLAS`` or the
  preferred installed one);
- ``threads``: threads, an integer from 1 to ``LlvmSchedule.MAX_THREADS`` (default
  ``$RNNC_THREADS``, same range, or the cores this process may use); anything else is an
  ``RnncError``. They are BLAS's threads, and the size of the thread team when ``team`` is on;
- ``team``: run the time loop of a sequence whose recurrent products are big enough, or the
  ``linear_scan`` nodes of one whose scans are, on a team of ``threads`` threads, a bool
  (default: on, unless ``$RNNC_TEAM`` is ``0``; ``docs/threads.md``);
- ``team_split``: how a team splits a gated cell's step, ``"columns"`` (the default) or
  ``"units"`` (:class:`~rnnc.backends.schedule.LlvmSchedule`);
- ``schedule``: an :class:`~rnnc.backends.schedule.LlvmSchedule` holding every decision of how
  to run (the thresholds of the team and the panel kernel among them); the three options above
  fill the fields it leaves None. :meth:`LlvmBackend.schedule` gives the one a program runs;
- ``cache_dir``: the cache directory (default ``$RNNC_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/rnnc`` or ``~/.cache/rnnc``): object code goes to ``<cache_dir>/llvm``
  and the BLAS tuning file to ``<cache_dir>/blas.json``. ``False`` keeps object code in
  memory only (the tuning file then stays in the default directory);
- ``code_cache_mb``: the bound of the in-memory code cache in MiB (default
  ``$RNNC_CODE_CACHE_MB`` or 256), least recently used code dropped first. The bound is
  per cache directory and process; the last backend that sets it wins.

``docs/caches.md`` describes the caches.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rnnc import backends, diskcache, process
from rnnc.backends.llvm import autotune, cache, codegen, pool, split
from rnnc.backends.llvm import blas as blas_lib
from rnnc.backends.llvm.context import Plan
from rnnc.backends.schedule import LlvmSchedule, gemm_precision, given
from rnnc.backends.steps import NUMPY_DTYPES, resolve
from rnnc.errors import BackendUnavailable, RnncTypeError, RnncValueError
from rnnc.fingerprint import fingerprint
from rnnc.ir import Program

_ALIGN = 64
_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_void_p)
MAX_THREADS = process.MAX_THREADS
_threads_set: dict[str, int] = {}
_threads_lock = process.Lock()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Runner(backends.Runner):
    """``runner(env, dims) -> results`` for one compiled program; safe from many threads."""

    def __init__(self, compiled: cache.Compiled, libraries: list[blas_lib.Blas],
                 schedule: LlvmSchedule, dtype: str, compile_seconds: float,
                 tuning_dir: Path | None = None,
                 team: Callable[[], cache.Compiled] | None = None, team_work: int = 0,
                 scans: tuple[int, int] = (0, 0)) -> None:
        self.compiled = compiled  # keeps the engine alive after the code cache drops it
        self.schedule = schedule  # its per-call thresholds choose the team at each (T, B)
        self.threads = schedule.threads
        # The team build, compiled on first use, and the multiply-adds per batch row and step
        # of the products it splits in the loop and of the linear_scan nodes outside it.
        self._team_build, self.team_work = team, team_work
        # split.scan_work: the linear_scan nodes' features, all and the narrowest.
        self.scan_work, self.scan_width = scans
        self._team: tuple[cache.Compiled, Any] | None = None
        self._team_lock = process.Lock()
        self.tuning_dir = tuning_dir
        self.plan = compiled.plan
        self.dtype = np.dtype(NUMPY_DTYPES[dtype])
        self.libraries = {b.name: b for b in libraries}
        self._tables: dict[tuple[int, int, int], np.ndarray] = {}
        self._tables_lock = process.Lock()
        self._shapes: dict[tuple[int, int], tuple] = {}  # (T, B) -> args' and results' shapes
        self.function = _SIGNATURE(compiled.address)
        self.compile_seconds = compile_seconds
        self._local = threading.local()
        # BLAS takes 32-bit sizes: the rows of every array (T * B times its fixed leading
        # dims) must stay below 2^31.
        shapes = [s for _, s in self.plan.args + self.plan.results] + list(self.plan.slots)
        self._widest = max([int(np.prod([d for d in s[:-1] if isinstance(d, int)],
                                        dtype=np.int64)) for s in shapes] + [1])

    def gemm_choice(self, T: int, B: int, plan: Plan | None = None) -> list[str]:
        """What each GEMM site of ``plan`` (default: the one-thread build's) uses at (T, B),
        as ``library@threads``: the fastest for its shape among the installed libraries at
        one thread or all of them, measured once per shape and remembered on disk."""
        names = autotune.candidate_names(self.libraries.values(), self.threads)
        choice, dims = [], {"T": T, "B": B}
        for _, _, sizes in (plan or self.plan).gemms:
            m, n, k = (int(np.prod(resolve(d, dims), dtype=np.int64)) for d in sizes)
            choice.append(autotune.choose_for_site(
                m, n, k, self.dtype, names, cache_dir=self.tuning_dir,
                bounds=(self.schedule.blas_one_thread_max_work,
                        self.schedule.blas_all_threads_min_work)))
        return choice

    def _gemm_table(self, T: int, B: int, plan: Plan | None = None) -> np.ndarray:
        key = (T, B, id(plan or self.plan))
        with self._tables_lock:
            if key not in self._tables:
                entries = []
                for name in self.gemm_choice(T, B, plan):
                    library, threads = autotune.split_candidate(name)
                    setter = library.threads_addr or 0
                    entries += [library.gemm_addr(self.dtype), setter, threads if setter else 0]
                self._tables[key] = np.array(entries or [0], dtype=np.uint64)
                while len(self._tables) > 16:
                    self._tables.pop(next(iter(self._tables)))
            return self._tables[key]

    def team_size(self, B: int, T: int = 0) -> int:
        """The threads that run a sequence of ``T`` steps and batch ``B``: 1 unless the team
        pays, for the products of each step or for the linear_scan nodes over all steps."""
        if self._team_build is None:
            return 1
        schedule = self.schedule
        work = T * B * self.scan_work
        form = self.scan_form(B, T) if 0 < work and work >= schedule.scan_team_min_work \
            else None
        scans = form == "columns" or (form == "steps" and work >= schedule.scan_chunk_min_work)
        return self.threads if scans or B * self.team_work >= schedule.team_min_work else 1

    def scan_form(self, B: int, T: int) -> str | None:
        """How the team build splits the narrowest ``linear_scan`` at (T, B) on a team of
        ``threads`` (:func:`split.scan_form`); None: no team pays for it, or no scan."""
        if not self.scan_work:
            return None
        return split.scan_form(B * self.scan_width, self.dtype.itemsize, T, self.threads,
                               (self.schedule.scan_thread_min_bytes,
                                self.schedule.scan_chunk_min_steps,
                                self.schedule.scan_workspace_bytes))

    def _team_function(self) -> tuple[cache.Compiled, Any]:
        with self._team_lock:
            if self._team is None:
                compiled = self._team_build()
                self._team = compiled, pool.SIGNATURE(compiled.address)
            return self._team

    def _workspace(self, T: int, B: int, plan: Plan | None = None) -> list[int]:
        """Slot addresses for (T, B), allocated once per shape, plan and calling thread."""
        spaces = getattr(self._local, "spaces", None)
        if spaces is None:
            spaces = self._local.spaces = OrderedDict()
        plan = plan or self.plan
        key = (T, B, id(plan))
        if key in spaces:
            spaces.move_to_end(key)
            return spaces[key][1]
        dims = {"T": T, "B": B}
        sizes = [int(np.prod(resolve(s, dims), dtype=np.int64)) * self.dtype.itemsize
                 for s in plan.slots]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-max(size, 1) // _ALIGN) * _ALIGN
        raw = np.empty(total + _ALIGN, np.uint8)
        base = raw.ctypes.data + (-raw.ctypes.data) % _ALIGN
        addresses = [base + off for off in offsets]
        spaces[key] = (raw, addresses)
        while len(spaces) > 4:  # a few recent shapes; memory stays bounded
            spaces.popitem(last=False)
        return addresses

    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        T, B = dims["T"], dims["B"]
        if not (isinstance(T, int | np.integer) and isinstance(B, int | np.integer)) \
                or T < 0 or B < 0:
            raise RnncValueError(f"dims T and B must be integers >= 0, got T={T!r}, B={B!r}")
        T, B = int(T), int(B)
        sizes = {"T": T, "B": B}
        if T * B * self._widest >= 2**31:
            raise RnncValueError(f"T={T}, B={B} is too large for 32-bit BLAS sizes")
        pointers: list[int] = []
        shapes = self._shapes.get((T, B))
        if shapes is None:  # resolved once per size: a small call's Python time counts
            if len(self._shapes) > 16:
                self._shapes.clear()
            shapes = self._shapes[T, B] = (
                [(name, resolve(shape, sizes)) for name, shape in self.plan.args],
                [(name, resolve(shape, sizes)) for name, shape in self.plan.results])
        for name, expected in shapes[0]:
            arr = env.get(name)
            if not isinstance(arr, np.ndarray):
                raise RnncTypeError(f"{name!r} must be a NumPy array, got {type(arr).__name__}")
            if arr.dtype != self.dtype:
                raise RnncTypeError(f"{name!r} must be {self.dtype}, got {arr.dtype}")
            if arr.shape != expected:
                raise RnncValueError(f"{name!r} must have shape {expected}, got {arr.shape}")
            if not (arr.flags.c_contiguous and arr.flags.aligned):
                raise RnncValueError(f"{name!r} must be C-contiguous and aligned")
            pointers.append(arr.ctypes.data)
        results = {}
        for name, shape in shapes[1]:
            if name not in results:
                results[name] = np.empty(shape, self.dtype)
            pointers.append(results[name].ctypes.data)
        size = self.team_size(B, T)
        if size > 1:
            compiled, function = self._team_function()
            table = np.array(pointers + self._workspace(T, B, compiled.plan), dtype=np.uint64)
            gemms = self._gemm_table(T, B, compiled.plan)
            if pool.run_team(function, (table.ctypes.data, T, B, gemms.ctypes.data), size):
                return results
        gemms = self._gemm_table(T, B)
        table = np.array(pointers + self._workspace(T, B), dtype=np.uint64)
        # ctypes releases the GIL for the whole sequence.
        self.function(table.ctypes.data, T, B, gemms.ctypes.data)
        return results


class LlvmBackend:
    """Native code through llvmlite: one LLVM function per program."""

    name = "llvm"
    # Off by default: the linear_scan kernel writes A, Bv and C as whole sequences and is
    # memory-bound (a team splits it, rarely faster), no faster than the fused loop it
    # replaces (docs/passes.md).
    parallel_scan = False
    device = None  # runs on the host

    def __init__(self, blas: str | None = None, threads: int | None = None,
                 cache_dir: str | os.PathLike | bool | None = None,
                 code_cache_mb: float | None = None, team: bool | None = None,
                 team_split: str | None = None, schedule: LlvmSchedule | None = None,
                 **options: Any) -> None:
        backends.refuse_unknown_options(self.name, LlvmBackend.__init__, options)
        name = blas if blas is not None else process.BLAS.value()
        try:
            self.blas = blas_lib.get(name)
        except ValueError as err:
            raise BackendUnavailable(f"backend 'llvm': {err}") from None
        # A named library is used for every GEMM; otherwise each GEMM shape gets the fastest
        # installed library of the same calling convention.
        self.libraries = [self.blas] if name else blas_lib.same_convention(self.blas)
        asked = given(schedule, LlvmSchedule, self.name).merged(
            {"threads": threads, "team": team, "team_split": team_split})
        team = asked.team
        if team is None:
            team = process.TEAM.value(True)
        # What every program of this backend starts from (schedule() derives a program's).
        self.base_schedule = dataclasses.replace(
            asked, threads=_threads_option(asked.threads), team=team,
            team_split=asked.team_split or "columns", precision=asked.precision or "fp32")
        self.threads = self.base_schedule.threads
        if not (cache_dir is None or isinstance(cache_dir, bool | str | os.PathLike)):
            raise RnncTypeError(f"cache_dir must be a directory path, True (the default cache "
                                f"directory) or False (memory only), got "
                                f"{type(cache_dir).__name__} {cache_dir!r}")
        # The tuning file follows an explicit directory; otherwise blas finds the default.
        self.tuning_dir = None if cache_dir in (None, True, False) else Path(cache_dir)
        root = None if cache_dir is False else \
            self.tuning_dir if self.tuning_dir is not None else diskcache.default_root()
        self.cache = cache.code_cache(root, _memory_bound(code_cache_mb))

    def _set_threads(self) -> None:
        # The count is process-wide in every BLAS; set it only when it changes, never while
        # this process might be inside a GEMM for another backend object.
        with _threads_lock:
            for library in self.libraries:
                if _threads_set.get(library.name) != self.threads:
                    blas_lib.set_threads(self.threads, library)
                    _threads_set[library.name] = self.threads

    def schedule(self, program: Program, mode: str) -> LlvmSchedule:
        """How ``program`` (the program of ``mode``) runs: the backend's schedule, whatever
        the program but its products' precision (its thresholds choose the team per call, from
        ``T`` and ``B``)."""
        return dataclasses.replace(self.base_schedule, precision=gemm_precision(program))

    def code_key(self, program: Program, mode: str, team: bool = False,
                 identity: str | None = None) -> str:
        """The code cache key of ``program``'s build (``team``: the thread team's), hashing
        what lowering reads: the build and the schedule as it reads it."""
        built = self.schedule(program, mode).for_build(team)
        return cache.key(identity or fingerprint(program), program.dtype, self.blas.convention,
                         built.key() + (":team" if team else ""))

    def build(self, program: Program, mode: str) -> Runner:
        """A callable ``(env, dims) -> results`` running ``program`` natively, as
        :meth:`schedule` says (lowering reads the program and the schedule alone: every mode's
        program is built alike)."""
        self._set_threads()
        start = time.perf_counter()
        identity = fingerprint(program)
        schedule = self.schedule(program, mode)
        fits = lambda plan: cache.plan_fits(plan, program)  # noqa: E731

        def compiled(team: bool) -> cache.Compiled:
            return self.cache.get(self.code_key(program, mode, team, identity), identity,
                                  lambda: codegen.lower(program, self.blas.convention,
                                                        schedule.for_build(team), team), fits)

        team, work, scans = None, split.team_work(program), split.scan_work(program)
        if schedule.team and schedule.threads > 1 and (work or scans[0]):
            team = lambda: compiled(True)  # noqa: E731
        return Runner(compiled(False), self.libraries, schedule, program.dtype,
                      time.perf_counter() - start, self.tuning_dir, team, work, scans)


def _threads_option(threads: int | None) -> int:
    """The BLAS thread count: ``threads`` (checked by the schedule), else ``$RNNC_THREADS``
    (checked by rnnc.process), else every core this process may use."""
    if threads is not None:
        return threads
    return process.THREADS.value() or min(_cores(), LlvmSchedule.MAX_THREADS)


def _memory_bound(code_cache_mb: float | None) -> int | None:
    """The in-memory code cache bound in bytes from ``code_cache_mb=`` or
    ``$RNNC_CODE_CACHE_MB``; None keeps the cache's current bound."""
    value = code_cache_mb
    if value is None:
        value = process.CODE_CACHE.value()
        return None if value is None else int(value * (1 << 20))
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        raise RnncValueError(f"code_cache_mb must be a number of MiB >= 0 (0 keeps no compiled "
                             f"code in memory), got {code_cache_mb!r}")
    return int(value * (1 << 20))

