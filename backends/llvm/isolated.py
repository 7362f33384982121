"""Run a function that returns bytes in a child process made by ``fork()``, so that what it
leaves behind in native memory goes away with the child.

LLVM's optimization pipeline, as llvmlite drives it, keeps about as much memory as the module
it optimized, and disposing of every object llvmlite hands out (module, context, pass
builder, pass manager, tuning options) does not return it: 200 distinct compiled cells grew a
process by about 300 MB. :mod:`rnnc.backends.llvm.cache` therefore optimizes and emits each
module in a child. The child inherits the parent's memory (copy-on-write), so it starts at
once, needs no import and compiles exactly what the parent would have; it writes the object
code to a pipe and ends with ``os._exit``, running nothing of the parent's.

Where ``fork()`` is missing or unsafe (not Linux) or fails, :func:`run` returns None and the
caller compiles in its own process, as it does when the child fails (so an error is raised
there, with its own message).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

# Linux only: fork() without exec() is unsafe on macOS, absent on Windows.
AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "fork")
_CHUNK = 1 << 20


def run(function: Callable[..., bytes], *args: object) -> bytes | None:
    """``function(*args)`` computed in a forked child, or None if that is not possible."""
    if not AVAILABLE:
        return None
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: compute, write, leave without running anything of the parent's
        code = 1
        try:
            os.close(read_end)
            data = memoryview(function(*args))
            while data:
                data = data[os.write(write_end, data[:_CHUNK]):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return _collect(pid, read_end)


def _collect(pid: int, read_end: int) -> bytes | None:
    """The child's bytes once it has exited successfully; None if it failed."""
    chunks, reaped = [], False
    try:
        while chunk := os.read(read_end, _CHUNK):
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        reaped = True
        return b"".join(chunks) if os.waitstatus_to_exitcode(status) == 0 else None
    finally:
        os.close(read_end)
        if not reaped:  # interrupted while waiting: the child has no one left to read it
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
