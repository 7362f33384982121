"""Process-wide state: the bounds of rnnc's caches, its environment numbers, one fork policy.

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
(:data:`CODE_CACHE_MB`) and each disk cache directory (:data:`DISK_CACHE_MB`).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

# Optimized programs kept by rnnc.passes.run_cached, least recently used first out.
PASS_CACHE_PROGRAMS = 128
# Compiled functions of the standard cells that rnnc.RNN layers share (least recently used
# first out; a layer keeps its own references, so eviction never breaks one).
LAYER_CACHE_FUNCTIONS = 32
# The default bound of the in-memory LLVM code cache, per cache directory ($RNNC_CODE_CACHE_MB).
CODE_CACHE_MB = 256
# The default bound of one disk cache directory's entries ($RNNC_DISK_CACHE_MB).
DISK_CACHE_MB = 2048

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


def env_mib(name: str, default: float, warning: type[Warning] = UserWarning) -> float:
    """The MiB in ``$name``: a finite number >= 0, else ``default``; a value that is not one
    (``inf``, ``nan``, ``-1``, ``lots``) warns once and is ignored."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        mib = float(value)
    except ValueError:
        mib = math.nan
    if math.isfinite(mib) and mib >= 0:
        return mib
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"{name}={value!r} is not a finite number of MiB >= 0; using the "
                      f"default {default:g}", warning, stacklevel=3)
    return default
