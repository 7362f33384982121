"""Passes and pipelines. A pass is a pure function ``Program -> Program`` registered by name.

The manager owns the order: a pipeline lists every pass it runs, and no pass runs another (a
pass that needs cleaning up after it is followed in the pipeline by the passes that do it,
its ``FOLLOW_UPS``). The manager runs ``verify`` after every pass and calls a callback between
passes; printing the IR after every pass and timing the passes are callbacks.
"""

from __future__ import annotations

import importlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from rnnc import process
from rnnc.errors import RnncValueError
from rnnc.ir import Program
from rnnc.verify import verify

Pass = Callable[[Program], Program]
Callback = Callable[[str, Program, float], None]

PASSES: dict[str, Pass] = {}

_MODULES = ("canonicalize", "fuse_gate_matmuls", "hoist_sequence", "fuse_elementwise",
            "mask_lengths", "autodiff", "parallel_scan", "drop_empty_loop", "cleanup")


def register(name: str) -> Callable[[Pass], Pass]:
    """Register a pass under its kebab-case ``name``."""
    def deco(fn: Pass) -> Pass:
        assert name not in PASSES, name
        PASSES[name] = fn
        return fn
    return deco


def _load() -> None:
    # Imported on first use: each pass module imports this one to register itself.
    for mod in _MODULES:
        importlib.import_module(f"rnnc.passes.{mod}")


# The passes every mode shares, run before autodiff so that backward sees fused gates.
PREPARE: tuple[str, ...] = ("canonicalize", "fuse-gate-matmuls")

# Passes that finish another one's rewrite, listed right after it in every pipeline. Where that
# pass returned its program unchanged they have nothing to finish, and the manager skips them.
# parallel-scan leaves the loop fewer carries: what no carry needs any longer leaves the loop, a
# loop left empty goes, the copies made on the way merge and outputs nobody reads go.
FOLLOW_UPS: dict[str, tuple[str, ...]] = {
    "parallel-scan": ("hoist-sequence", "drop-empty-loop", "cse", "prune-outputs"),
}
PARALLEL_SCAN: tuple[str, ...] = ("parallel-scan",) + FOLLOW_UPS["parallel-scan"]

# The passes that shape the loop, after the program is prepared (and differentiated).
LOOP: tuple[str, ...] = ("hoist-sequence",) + PARALLEL_SCAN + ("fuse-elementwise",)

PIPELINES: dict[str, tuple[str, ...]] = {
    "inference": PREPARE + LOOP,
    "forward": PREPARE + ("autodiff-forward",) + LOOP,
    "backward": PREPARE + ("autodiff-backward", "canonicalize") + LOOP,
}

MODES = tuple(PIPELINES)
PIPELINES["prepare"] = PREPARE

# The oracle: the traced program with only the passes that give it its meaning (variable
# lengths and differentiation), no optimization.
ORACLE: dict[str, tuple[str, ...]] = {
    "inference": (),
    "forward": ("autodiff-forward",),
    "backward": ("autodiff-backward",),
    "prepare": (),
}

# Second-order modes "a.b": autodiff-b run on the program autodiff-a made, for double backward.
# "backward.forward" is the backward that also stacks what its own backward,
# "backward.backward", reads; "forward.backward" is the forward's backward taking cotangents of
# the saved values too (d.save.N), reading what "forward.forward" stacks.
_AFTER_AUTODIFF = {"forward": LOOP, "backward": ("canonicalize",) + LOOP}
SECOND_ORDER = ("forward.forward", "forward.backward", "backward.forward", "backward.backward")
for _mode in SECOND_ORDER:
    _first, _second = _mode.split(".")
    ORACLE[_mode] = (f"autodiff-{_first}", f"autodiff-{_second}")
    PIPELINES[_mode] = PREPARE + ORACLE[_mode] + _AFTER_AUTODIFF[_second]


def save_writers(mode: str) -> list[tuple[str, int]]:
    """For each autodiff-backward of ``mode``: the mode whose program stacks the values it reads,
    and the autodiff's level (1 for the first): "backward" reads what "forward" saves;
    "backward.backward" reads what "forward" and "backward.forward" save."""
    parts = mode.split(".")
    return [(".".join(parts[:k] + ["forward"]), k + 1)
            for k, part in enumerate(parts) if part == "backward"]


def pipeline(mode: str, masked: bool = False, optimize: bool = True,
             parallel_scan: bool = True) -> tuple[str, ...]:
    """The pass names run for ``mode``; variable lengths put mask-lengths first.

    ``optimize=False`` gives the oracle's pipeline: mask-lengths and autodiff only;
    ``parallel_scan=False`` leaves out parallel-scan and its follow-ups."""
    if mode not in PIPELINES:
        raise RnncValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    names = (("mask-lengths",) if masked else ()) + (PIPELINES if optimize else ORACLE)[mode]
    return names if parallel_scan else _without(names, PARALLEL_SCAN)


def _without(names: tuple[str, ...], part: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` less every run of ``part`` in it."""
    out: list[str] = []
    k = 0
    while k < len(names):
        if names[k:k + len(part)] == part:
            k += len(part)
            continue
        out.append(names[k])
        k += 1
    return tuple(out)


def run(program: Program, names: Iterable[str], callback: Callback | None = None) -> Program:
    """Run the named passes in order, verifying the program after each that changed it. The
    follow-ups of a pass (``FOLLOW_UPS``), listed right after it, are skipped where it returned
    its program unchanged."""
    _load()
    names = tuple(names)
    for name in names:
        if name not in PASSES:
            raise RnncValueError(f"unknown pass {name!r}; passes are {sorted(PASSES)}")
    verify(program)
    k = 0
    while k < len(names):
        name, before = names[k], program
        start = time.perf_counter()
        program = PASSES[name](program)
        seconds = time.perf_counter() - start
        if program is not before:  # a pass that changed nothing returns what was verified
            verify(program)
        if callback is not None:
            callback(name, program, seconds)
        k += 1
        follow = FOLLOW_UPS.get(name, ())
        if program is before and follow and names[k:k + len(follow)] == follow:
            k += len(follow)  # nothing changed: nothing to finish
    return program


_CACHE: OrderedDict[tuple, Program] = OrderedDict()
_CACHE_LOCK = process.Lock()
CACHE_SIZE = process.PASS_CACHE_PROGRAMS  # programs kept, least recently used first out


def run_cached(identity: str, program: Program, names: tuple[str, ...]) -> Program:
    """``program`` after the passes ``names``, shared by every program of the same
    :meth:`~rnnc.ir.Program.fingerprint` ``identity`` (passes are pure and deterministic, and
    nothing mutates an optimized program)."""
    key = (identity, program.dtype, names)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    result = run(program, names)
    with _CACHE_LOCK:
        _CACHE[key] = result
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def clear_cache() -> None:
    """Forget every program :func:`run_cached` kept."""
    with _CACHE_LOCK:
        _CACHE.clear()
