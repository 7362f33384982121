"""Process-wide state: the bounds of rnnc's caches, the environment it reads, one fork policy.

Every lock, pool and cache that lives as long as the process follows one policy for ``fork()``,
kept here and registered with ``os.register_at_fork`` once:

- every :class:`Lock` is fresh (released) in the child: the thread that held it in the parent
  (a call in flight, a compile, a team call) does not exist there;
- what else a module keeps (a pool's worker threads, builds in flight, another library's
  lock) registers its own hooks with :func:`at_fork`: ``before`` runs in the parent just
  before the fork (latest registered first), ``after_in_parent`` and ``after_in_child``
  after it (in registration order; the child's after every lock is renewed).

The bounds of the in-memory caches are named here, so that one place says what the process
may keep: optimized programs (:data:`PASS_CACHE_PROGRAMS`), the standard cells' compiled
functions shared by layers (:data:`LAYER_CACHE_FUNCTIONS`), loaded LLVM code
(:data:`CODE_CACHE_MB` per directory, :data:`CODE_CACHE_DIRECTORIES` directories), the
measured GEMM choices (:data:`GEMM_CHOICES`) and each disk cache directory
(:data:`DISK_CACHE_MB`); :data:`CACHE_BOUNDS` lists them all.

Every environment variable rnnc reads is declared here once, as an :class:`EnvVar` with what
it means and how its text is read; modules ask the declaration (``process.THREADS.value()``)
and never ``os.environ`` (``tests/rnnc/test_process_state.py`` checks it, and
``docs/environment.md`` lists them).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rnnc.errors import RnncValueError

# Optimized programs kept by rnnc.passes.run_cached, least recently used first out.
PASS_CACHE_PROGRAMS = 128
# Compiled functions of the standard cells that rnnc.RNN layers share (least recently used
# first out; a layer keeps its own references, so eviction never breaks one).
LAYER_CACHE_FUNCTIONS = 32
# The default bound of the in-memory LLVM code cache, per cache directory ($RNNC_CODE_CACHE_MB).
CODE_CACHE_MB = 256
# The default bound of one disk cache directory's entries ($RNNC_DISK_CACHE_MB).
DISK_CACHE_MB = 2048
# In-memory LLVM code caches kept at once, one per cache directory (least recently used first
# out; a compiled function keeps its own code, so eviction never breaks one).
CODE_CACHE_DIRECTORIES = 8
# Loaded LLVM programs one in-memory code cache keeps, whatever their bytes (least recently
# used first out). Each loaded program maps its code and data sections, about three memory
# mappings; Linux gives a process 65530 (vm.max_map_count) and LLVM aborts the process when it
# cannot map a section, so the count is bounded: 8 directories x 512 programs is about 12,000.
CODE_CACHE_PROGRAMS = 512
# GEMM library choices the LLVM backend remembers (one per GEMM shape; oldest first out).
GEMM_CHOICES = 4096
# Every bound above, by the cache it bounds.
CACHE_BOUNDS = {"optimized programs": "PASS_CACHE_PROGRAMS",
                "layer functions": "LAYER_CACHE_FUNCTIONS",
                "LLVM code in memory, per directory (MiB)": "CODE_CACHE_MB",
                "LLVM programs in memory, per directory": "CODE_CACHE_PROGRAMS",
                "LLVM code cache directories": "CODE_CACHE_DIRECTORIES",
                "GEMM choices": "GEMM_CHOICES",
                "one disk cache directory (MiB)": "DISK_CACHE_MB"}

Hook = Callable[[], None]
_before: list[Hook] = []
_after_in_parent: list[Hook] = []
_after_in_child: list[Hook] = []
_locks: weakref.WeakSet[Lock] = weakref.WeakSet()
_warned: set[str] = set()


class Lock:
    """A ``threading.Lock`` that a child made by ``fork()`` finds released."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as ``threading.Lock.acquire``)."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()

    def locked(self) -> bool:
        """Whether some thread holds the lock."""
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def at_fork(before: Hook | None = None, after_in_parent: Hook | None = None,
            after_in_child: Hook | None = None) -> None:
    """Register what a module does around ``fork()`` (see the module docstring)."""
    for hook, hooks in ((before, _before), (after_in_parent, _after_in_parent),
                        (after_in_child, _after_in_child)):
        if hook is not None:
            hooks.append(hook)


def _run_before() -> None:
    for hook in reversed(_before):
        hook()


def _run_after_in_parent() -> None:
    for hook in _after_in_parent:
        hook()


def _run_after_in_child() -> None:
    for lock in list(_locks):
        lock._lock = threading.Lock()
    for hook in _after_in_child:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_run_before, after_in_parent=_run_after_in_parent,
                        after_in_child=_run_after_in_child)


# -- the environment


@dataclass(frozen=True)
class EnvVar:
    """One environment variable rnnc reads: its name, what it means, and how its text reads.

    ``parse`` takes the stripped, non-empty text and returns the value, or raises
    ``RnncValueError`` naming the variable and what it expects."""

    name: str
    doc: str
    parse: Callable[[str], Any] = str

    def text(self) -> str:
        """The variable's text, stripped; empty where it is unset."""
        return os.environ.get(self.name, "").strip()

    def value(self, default: Any = None) -> Any:
        """The parsed value, or ``default`` where the variable is unset or empty."""
        text = self.text()
        return self.parse(text) if text else default


ENV: dict[str, EnvVar] = {}  # every variable rnnc reads, by name


def _declare(name: str, doc: str, parse: Callable[[str], Any] = str) -> EnvVar:
    ENV[name] = EnvVar(name, doc, parse)
    return ENV[name]


SECOND_ORDER_CHECK = "second-order"  # check= (and RNNC_CHECK=) that adds double backward
MAX_THREADS = 1024  # the most BLAS threads the LLVM backend sets (threads=, RNNC_THREADS)


def _threads(text: str) -> int:
    # isascii: str.isdigit accepts digits such as "²" that int() refuses.
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_THREADS):
        raise RnncValueError(f"RNNC_THREADS must be a whole number of BLAS threads from 1 "
                             f"to {MAX_THREADS}, got {text!r}; unset it to use every core")
    return int(text)


def _mib(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            mib = float(text)
        except ValueError:
            mib = math.nan
        if not (math.isfinite(mib) and mib >= 0):
            raise RnncValueError(f"{name} must be a number of MiB >= 0, got {text!r}")
        return mib
    return parse


CHECK = _declare("RNNC_CHECK", "check= where compile leaves it out: 0 is off, second-order adds "
                 "double backward, anything else is on",
                 lambda t: SECOND_ORDER_CHECK if t == SECOND_ORDER_CHECK else t != "0")
CACHE_DIR = _declare("RNNC_CACHE_DIR", "the directory under which every rnnc cache lives")
XDG_CACHE_HOME = _declare("XDG_CACHE_HOME", "where RNNC_CACHE_DIR is unset, the cache root is "
                          "$XDG_CACHE_HOME/rnnc (default ~/.cache/rnnc)")
DISK_CACHE = _declare("RNNC_DISK_CACHE_MB", f"the bound of one disk cache directory in MiB "
                      f"(default {DISK_CACHE_MB}); a bad value warns and is ignored",
                      _mib("RNNC_DISK_CACHE_MB"))
CODE_CACHE = _declare("RNNC_CODE_CACHE_MB", f"the bound of the in-memory LLVM code cache in MiB "
                      f"(default {CODE_CACHE_MB}; 0 keeps none)", _mib("RNNC_CODE_CACHE_MB"))
BLAS = _declare("RNNC_BLAS", "the LLVM backend's BLAS (openblas, mkl, scipy) where blas= is "
                "left out; unset picks the fastest installed per GEMM shape")
THREADS = _declare("RNNC_THREADS", f"the LLVM backend's BLAS threads where threads= is left "
                   f"out, 1 to {MAX_THREADS} (default: the cores this process may use)",
                   _threads)
TEAM = _declare("RNNC_TEAM", "0 turns the LLVM backend's thread team off where team= is left "
                "out", lambda t: t != "0")
OPENBLAS_THREAD_TIMEOUT = _declare(
    "OPENBLAS_THREAD_TIMEOUT", "read by OpenBLAS when it loads; where unset, rnnc sets it "
    "while its own OpenBLAS loads (rnnc.backends.llvm.blas.THREAD_TIMEOUT) and removes it after")


@contextmanager
def default_while(var: EnvVar, value: str) -> Iterator[None]:
    """``var`` = ``value`` inside the block, for a library that reads it then, unless the
    caller set it; removed again afterwards, so that nothing loaded later sees it."""
    if var.name in os.environ:
        yield
        return
    os.environ[var.name] = value
    try:
        yield
    finally:
        os.environ.pop(var.name, None)


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with ``overrides``: for a subprocess rnnc starts."""
    return {**os.environ, **overrides}


def env_mib(var: EnvVar, default: float, warning: type[Warning] = UserWarning) -> float:
    """The MiB in ``var``: a finite number >= 0, else ``default``; a value that is not one
    (``inf``, ``nan``, ``-1``, ``lots``) warns once and is ignored."""
    try:
        return var.value(default)
    except RnncValueError:
        pass
    if var.name not in _warned:
        _warned.add(var.name)
        warnings.warn(f"{var.name}={var.text()!r} is not a finite number of MiB >= 0; using the "
                      f"default {default:g}", warning, stacklevel=3)
    return default
