"""bfloat16 GEMMs of a plan: loop constants rounded once per call, the other operands per step.

A ``matmul[precision=bf16]`` multiplies bfloat16 operands with float32 sums (:mod:`.bf16`).
Each float32 operand is rounded to 16-bit bfloat16 bits by one launch of the rounding kernel
(:data:`.bf16.ROUND_SOURCE`; :func:`.bf16.emulated_bits` in emulation) before cuBLAS reads
it. A loop constant (the recurrent weight ``U`` of ``h @ U`` and of the backward's
``dG @ U^T``, a parameter or a value computed before the loop) is the same array at every
step, so rounding it at every one of T steps would repeat the same launch over the whole
weight T - 1 times. :func:`bf16_constants` finds those operands in the loop body (and the
weights the fused-step and persistent kernels read as bits) and :func:`convert_constants`
records one conversion of each into a buffer the plan owns, an ``Entry("pre", "convert")``,
before the loop; the loop's :class:`Bf16Gemm` reads those bits as they are and rounds only
its other operands, the ones that change from step to step. The conversions are calls of the
plan like any other, so a CUDA graph captures them and every replay rounds the weights of
that call again: a weight changed between calls is never read stale.

Every rounding goes through the host's :class:`Rounder`, whose ``launches`` counts them
(tests/backends/test_cuda_bf16_gemm.py counts one per constant per call plus one per
per-step operand and step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from rnnc.backends.cuda import bf16
from rnnc.backends.cuda.blas import COMPUTE_32F, CUDA_R_16BF, gemm_arguments
from rnnc.backends.cuda.codegen import Gemm, Work
from rnnc.backends.cuda.fused_step import FusedStep
from rnnc.backends.steps import ProgramSteps
from rnnc.ir import ARG
from rnnc.precision import BF16

BLOCK, MAX_BLOCKS = 256, 4096  # the rounding kernel's launch: a grid-stride loop


class Rounder:
    """Rounds float32 arrays into bfloat16 bits (uint16): one launch of the rounding
    ``kernel`` each on a GPU (``xp`` CuPy), :func:`.bf16.emulated_bits` where ``kernel`` is
    None (emulation). ``launches`` counts the roundings made from Python: every one in
    emulation, where graphs replay Python calls; on a GPU those made before a capture."""

    def __init__(self, xp: Any, kernel: Any = None) -> None:
        self.xp, self.kernel = xp, kernel
        self.launches = 0

    def __call__(self, x: Any, out: Any) -> None:
        """``out`` (C-ordered uint16, ``x``'s shape) = the bfloat16 bits of ``x`` (float32;
        a view that is not C-ordered is copied first, which a capture cannot hold)."""
        if not x.size:
            return
        self.launches += 1
        if self.kernel is None:
            bf16.emulated_bits(x, out)
            return
        if not x.flags.c_contiguous:
            x = self.xp.ascontiguousarray(x)
        self.kernel((min((x.size + BLOCK - 1) // BLOCK, MAX_BLOCKS),), (BLOCK,),
                    (x, out, np.int64(x.size)))


class Bf16Gemm:
    """One call site's bfloat16 ``matmul(a, b, out=)`` with float32 sums. A float32 operand
    is rounded at each call into bits this site owns; a uint16 operand is bits already (a loop
    constant :func:`convert_constants` rounded before the loop) and is read as it is. Through
    ``blas`` (:class:`~.blas.Cublas`) on a GPU, ``fallback`` where a layout needs a copy;
    without ``blas`` (emulation, or a GPU whose cuBLAS library could not be loaded)
    ``xp.matmul`` multiplies the bits widened to float32, which is exact."""

    def __init__(self, xp: Any, rounder: Rounder, blas: Any = None, fallback: Any = None
                 ) -> None:
        self.xp, self.rounder, self.blas, self.fallback = xp, rounder, blas, fallback
        self.bits: dict[tuple[int, tuple], Any] = {}  # per operand and shape: its bits

    def _rounded(self, which: int, x: Any) -> Any | None:
        """The bfloat16 bits of ``x`` laid out as ``x``: ``x`` itself if it is bits, else
        rounded into this site's array from the C-ordered array under the view; None on a GPU
        where neither order is contiguous."""
        if x.dtype == np.uint16:
            return x
        base, flip = (x, False) if x.flags.c_contiguous else (x.T, True)
        if not base.flags.c_contiguous:
            if self.blas is not None:
                return None
            base, flip = self.xp.ascontiguousarray(x), False  # no capture without blas
        key = (which, tuple(base.shape))
        bits = self.bits.get(key)
        if bits is None:  # made on the first (eager) call, never inside a capture
            bits = self.bits[key] = self.xp.empty(base.shape, np.uint16)
        self.rounder(base, bits)
        return bits.T if flip else bits

    def __call__(self, a: Any, b: Any, out: Any = None) -> Any:
        a16, b16 = self._rounded(0, a), self._rounded(1, b)
        if self.blas is None:
            return self.xp.matmul(bf16.widened(a16), bf16.widened(b16), out=out)
        arguments = None if a16 is None or b16 is None or out is None else \
            gemm_arguments(a16, b16, out)
        if arguments is None:
            return self.fallback(a, b, out=out)
        self.blas.gemm(a16, b16, out, arguments, CUDA_R_16BF, COMPUTE_32F)
        return out


def bf16_constants(schedule: ProgramSteps, body: Iterable[Work]) -> dict[int, str]:
    """The loop constants that a bfloat16 product of the loop body reads, by body slot, with
    their names: each fused step's weight, and each operand of a bfloat16 GEMM that is a
    loop constant (an argument of the loop that every step reads whole)."""
    steps = {s.slot: s for s in schedule.body.steps}
    consts = set(schedule.scan.consts)
    found: dict[int, str] = {}
    for work in body:
        if isinstance(work, FusedStep) and work.bf16:
            # A loop constant (.fused_step.fused_pairs): the same array at every step.
            found[work.b] = steps[work.b].name
        elif isinstance(work, Gemm) and work.precision == BF16:
            for slot in (work.a, work.b):
                step = steps.get(slot)
                if step is not None and step.op is ARG and step.name in consts:
                    found[slot] = step.name
    return found


def convert_constants(constants: Mapping[int, str], env: Mapping[str, Any],
                      convert: Callable[[Any], Any]) -> dict[int, Any]:
    """The bfloat16 bits of each of ``constants`` (:func:`bf16_constants`) by body slot:
    ``convert(array)`` records one conversion per constant, however many slots read it."""
    by_name: dict[str, Any] = {}
    bits: dict[int, Any] = {}
    for slot, name in constants.items():
        if name not in by_name:
            by_name[name] = convert(env[name])
        bits[slot] = by_name[name]
    return bits
