"""The worker threads of the process's thread team, and one team call of a native function.

A team build of a program (:mod:`rnnc.backends.llvm.team`) is called once per thread with the
same arguments and the thread's index. Thread 0 is the caller; threads 1 .. N-1 are Python
threads created once per process (on first use, as many as the largest team asked for) that
wait on their own queue and make the native call, which releases the GIL, when handed one.

One team call runs at a time: a second call made meanwhile from another thread gets ``False``
from :func:`run_team` at once, and its caller runs one-thread code instead. Workers therefore
never wait on a team that cannot fill up. A forked child starts with no workers.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable
from functools import cache

import numpy as np

from rnnc import process
from rnnc.backends.llvm.team import SIZE, SLEEP, STATE_WORDS, YIELD

SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

_workers: list[_Worker] = []
_pool_lock = process.Lock()
_team_lock = process.Lock()


class _Worker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="rnnc-team", daemon=True)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            function, args, done = self.jobs.get()
            try:
                function(*args)
            finally:
                done.put(None)


def _workers_for(count: int) -> list[_Worker] | None:
    """``count`` workers, started on first need; None when a thread cannot be started."""
    with _pool_lock:
        try:
            while len(_workers) < count:
                worker = _Worker()
                worker.start()
                _workers.append(worker)
        except RuntimeError:
            return None
        return _workers[:count]


@cache
def libc_address(name: str) -> int:
    """The address of libc's function ``name`` (``sched_yield``, ``usleep``), or 0 where there
    is none."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0
    except (OSError, AttributeError, TypeError):
        return 0


def run_team(function: Callable[..., None], args: tuple, size: int) -> bool:
    """Call ``function(*args, state, tid)`` on ``size`` threads; False (nothing run) while
    another team call is in progress or when the workers cannot be started."""
    if not _team_lock.acquire(blocking=False):
        return False
    try:
        workers = _workers_for(size - 1)
        if workers is None:
            return False
        state = np.zeros(STATE_WORDS, np.int64)
        state[SIZE], state[YIELD] = size, libc_address("sched_yield")
        state[SLEEP] = libc_address("usleep")
        done: queue.SimpleQueue = queue.SimpleQueue()
        shared = args + (state.ctypes.data,)
        for tid, worker in enumerate(workers, 1):
            worker.jobs.put((function, shared + (tid,), done))
        try:
            function(*shared, 0)
        finally:
            _wait(done, len(workers))
        return True
    finally:
        _team_lock.release()


def _wait(done: queue.SimpleQueue, count: int) -> None:
    """Wait for ``count`` workers to finish, even through KeyboardInterrupt: they use the
    caller's arrays until then."""
    interrupted: BaseException | None = None
    while count:
        try:
            done.get()
            count -= 1
        except BaseException as err:  # noqa: BLE001 - re-raised once the workers are done
            interrupted = err
    if interrupted is not None:
        raise interrupted


# The child has none of the parent's threads (its locks are fresh: rnnc.process).
process.at_fork(after_in_child=_workers.clear)
