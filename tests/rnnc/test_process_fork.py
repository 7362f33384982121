"""One fork policy for every lock: a child made by fork() while another thread of the parent
holds one (inside a call, a compile, a team call) finds it released and finishes its own call.

Each child runs under a timeout and is killed if it blocks, so a regression fails the test
instead of hanging the suite."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable

import numpy as np
import pytest

import rnnc
from rnnc import process

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()"),
              pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")]
CHILD_SECONDS = 120


def _in_child(check: Callable[[], None]) -> tuple[bool, int | None]:
    """Run ``check()`` in a forked child; (whether it was still running after the timeout,
    its exit code)."""
    child = multiprocessing.get_context("fork").Process(target=check)
    child.start()
    child.join(CHILD_SECONDS)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join()
    return alive, child.exitcode


def _oracle(cell: rnnc.Cell, x: np.ndarray, params: dict) -> np.ndarray:
    ys, _ = rnnc.compile(cell, optimize=False)(x.astype(np.float64),
                                               {k: v.astype(np.float64) for k, v in params.items()})
    return ys["y"]


def test_a_child_forked_during_a_cuda_call_runs_the_same_function() -> None:
    cell = rnnc.cells.gru(3, 4)
    params = cell.init_params(seed=0)
    x = np.linspace(-1, 1, 5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    fn(x, params)  # build the runner and the plan of this shape
    runner = fn._runners[("inference", "f32", False)]
    parent, inside, release = os.getpid(), threading.Event(), threading.Event()
    real = runner._emulated

    def held(*args):  # the parent's call stops inside the runner, holding its lock
        if os.getpid() == parent:
            inside.set()
            release.wait(CHILD_SECONDS)
        return real(*args)

    runner._emulated = held
    caller = threading.Thread(target=lambda: fn(x, params))
    caller.start()
    try:
        assert inside.wait(60)
        want = _oracle(cell, x, params)

        def check() -> None:
            ys, _ = fn(x, params)
            if not np.allclose(ys["y"], want, rtol=1e-4, atol=1e-5):
                raise SystemExit(3)

        alive, code = _in_child(check)
    finally:
        release.set()
        caller.join()
    assert not alive, "the child blocked on the lock the parent's thread held"
    assert code == 0


@pytest.mark.parametrize("which", ["cuda runner", "llvm team", "function", "passes cache",
                                   "layer cache"])
def test_every_lock_is_released_in_a_forked_child(which: str) -> None:
    """Each lock of rnnc, held by a thread of the parent at the fork, is free in the child."""
    from rnnc import passes
    from rnnc.layers import rnn as layer_module

    if which == "cuda runner":
        fn = rnnc.compile(rnnc.cells.rnn(2, 2), backend="cuda", emulate=True)
        fn(np.ones((1, 1, 2), np.float32), fn.cell.init_params(seed=0))
        runner = fn._runners[("inference", "f32", False)]
        get_lock = lambda: runner._lock  # noqa: E731
    elif which == "llvm team":
        pool = pytest.importorskip("rnnc.backends.llvm.pool")
        get_lock = lambda: pool._team_lock  # noqa: E731
    elif which == "function":
        fn = rnnc.compile(rnnc.cells.rnn(2, 2))
        get_lock = lambda: fn._lock  # noqa: E731
    elif which == "passes cache":
        get_lock = lambda: passes._CACHE_LOCK  # noqa: E731
    else:
        get_lock = lambda: layer_module._CACHE_LOCK  # noqa: E731
    lock = get_lock()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(CHILD_SECONDS)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)

        def check() -> None:
            found = get_lock()  # what the child's code would take
            if not found.acquire(timeout=30):
                raise SystemExit(4)
            found.release()

        alive, code = _in_child(check)
    finally:
        release.set()
        holder.join()
    assert (alive, code) == (False, 0)


def test_fork_hooks_run_once_each_in_order(monkeypatch) -> None:
    """The registry runs ``before`` hooks latest first, the others in registration order."""
    calls: list[str] = []
    monkeypatch.setattr(process, "_before", [])
    monkeypatch.setattr(process, "_after_in_parent", [])
    monkeypatch.setattr(process, "_after_in_child", [])
    for name in "ab":
        process.at_fork(before=lambda n=name: calls.append(f"before {n}"),
                        after_in_parent=lambda n=name: calls.append(f"parent {n}"))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert calls == ["before b", "before a", "parent a", "parent b"]
