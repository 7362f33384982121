"""bfloat16 GEMMs in generated code: the kernel tiers, the operand formats and the dispatch.

A matmul node with ``attrs["precision"] == "bf16"`` multiplies its operands rounded to bfloat16
(round to nearest even) and accumulates in float32; the result is float32. Three kernel tiers
compute it, the best the host has (:func:`host_tier`):

- ``"amx"``: Intel AMX tiles, ``tdpbf16ps`` (:mod:`rnnc.backends.llvm.amx`);
- ``"avx512bf16"``: AVX-512 ``vdpbf16ps`` in a register-tiled kernel
  (:mod:`rnnc.backends.llvm.dpbf16`);
- ``"emulate"``: the same rounding with float32 vector FMAs, on any x86-64
  (:mod:`rnnc.backends.llvm.dpbf16` too: only the inner product differs).

Every tier reads the same two formats:

- the activations ``a`` (rows x K, float32) converted row by row into ``abuf``: rows of ``Kp``
  bfloat16, zero beyond ``K`` (:func:`convert_function`); ``Kp`` is ``K`` rounded up to
  :data:`K_BLOCK`, one AMX tile's depth;
- the weights ``w`` (K x N, float32) packed into the VNNI pair layout by column panels of
  :data:`PANEL` columns: panel ``p`` holds ``Kp / 2`` rows, one per pair of K rows, each row
  the panel's columns with the pair interleaved, ``packed[p][q][c][j] = bf16(w[2q + j,
  PANEL * p + c])`` (zero outside ``w``) (:func:`pack_function`). A ``vdpbf16ps`` reads 16
  columns of one pair row as one vector; an AMX B tile is 16 pair rows of 16 columns.

The packed weights live in a workspace slot of the call site with a marker, null at the
start of every run, holding the address of the matrix packed there: the weights are packed
at the first call of a run and reused while that address is the one multiplied, the same
rule as the float32 panel kernel's (:mod:`rnnc.backends.llvm.gemm`).
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Callable
from typing import Literal

from llvmlite import ir

from rnnc.backends.llvm.context import I32, I64
from rnnc.backends.llvm.kernels import emit_loop

Tier = Literal["amx", "avx512bf16", "emulate"]
TIERS: tuple[Tier, ...] = ("amx", "avx512bf16", "emulate")
PANEL = 32  # columns of a packed panel: two AMX tiles or two vdpbf16ps vectors
K_BLOCK = 32  # bf16 values in one row of an AMX A tile (64 bytes): K is padded to this
AMX_FEATURES = "+amx-tile,+amx-bf16,+avx512bf16,+avx512f,+avx512bw,+avx512vl"

# Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) lets the process use AMX tiles.
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


class BFloatType(ir.types.Type):
    """LLVM's ``bfloat``, which llvmlite's IR builder does not name."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash("bfloat")


I16 = ir.IntType(16)
BF16 = BFloatType()
BF16P = I16.as_pointer()  # bf16 buffers are passed as i16*: llvmlite has no bfloat pointer
F32 = ir.FloatType()


def padded_k(k: int) -> int:
    """K rounded up to :data:`K_BLOCK`: the row length of ``abuf`` and the packed depth."""
    return -(-k // K_BLOCK) * K_BLOCK


def panel_count(n: int) -> int:
    """The packed panels of ``n`` columns (the last one zero-padded)."""
    return -(-n // PANEL)


def packed_words(k: int, n: int) -> int:
    """The float32 words holding the packed weights of a K x N matrix."""
    return panel_count(n) * PANEL * padded_k(k) // 2


@functools.cache
def request_amx() -> bool:
    """Ask the Linux kernel, once per process, for the AMX tile state; True when granted.

    Without it the first tile instruction faults. Anything but x86-64 Linux, or a kernel
    that refuses (too old, or the CPU has no AMX), gives False: the callers then use the
    next tier.
    """
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def host_tier() -> Tier:
    """The fastest tier this process can run: AMX where the CPU has it and the kernel grants
    the tile state, else AVX512-BF16 where the CPU has it, else the emulation."""
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if features.get("amx-tile") and features.get("amx-bf16") and request_amx():
        return "amx"
    if features.get("avx512bf16") and features.get("avx512f"):
        return "avx512bf16"
    return "emulate"


def with_target_features(text: str) -> str:
    """The module text with the AMX target features on the definitions of the AMX kernels.

    A host target machine with AMX has them already; naming them keeps the module valid on
    any host (so a tier can be built, and inspected, where it cannot run).
    """
    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features().flatten()
    attribute = f' "target-features"="{host},{AMX_FEATURES}"'
    return "\n".join(line + attribute if line.startswith('define') and '@"rnnc.amx.' in line
                     else line for line in text.splitlines())


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def internal_function(module: ir.Module, name: str, args: list[ir.Type]
                      ) -> tuple[ir.Function, bool]:
    """The internal ``void`` function ``name`` of ``module``, and whether it is new."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing, False
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    return fn, True


def to_bf16(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """``value`` (float, double or a vector of float) rounded to bfloat16, to nearest even,
    as its bits (``i16`` or a vector of them); NaN stays a quiet NaN.

    Integer arithmetic on the float32 bits, so that no host needs a conversion instruction
    or a runtime library (LLVM lowers ``fptrunc`` to ``bfloat`` to a call of
    ``__truncsfbf2`` on a core without AVX512-BF16). A double is first narrowed to float32
    rounding to odd, which makes the second rounding exact.
    """
    if isinstance(value.type, ir.DoubleType):
        value = _float_round_to_odd(b, value)
    count = value.type.count if isinstance(value.type, ir.VectorType) else None
    i32 = ir.VectorType(I32, count) if count else I32
    i16 = ir.VectorType(I16, count) if count else I16

    def const(v: int) -> ir.Constant:
        return ir.Constant(i32, [v] * count) if count else ir.Constant(I32, v)

    bits = b.bitcast(value, i32)
    odd = b.and_(b.lshr(bits, const(16)), const(1))
    rounded = b.lshr(b.add(b.add(bits, const(0x7FFF)), odd), const(16))
    quiet = b.or_(b.lshr(bits, const(16)), const(0x40))
    return b.trunc(b.select(b.fcmp_unordered("uno", value, value), quiet, rounded), i16)


def _float_round_to_odd(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A double narrowed to float32 rounding to odd: toward zero, the last bit set when
    inexact (NaN and infinities as they are)."""
    nearest = b.fptrunc(value, F32)
    bits = b.bitcast(nearest, I32)
    back = b.fpext(nearest, ir.DoubleType())
    # Rounded away from zero: one step back toward zero (a magnitude's bits are monotonic).
    away = b.fcmp_ordered(">", b.call(_fabs(b.module), [back]),
                          b.call(_fabs(b.module), [value]))
    bits = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    inexact = b.fcmp_ordered("!=", back, value)
    return b.bitcast(b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits), F32)


def _fabs(module: ir.Module) -> ir.Function:
    double = ir.DoubleType()
    return module.globals.get("llvm.fabs.f64") or ir.Function(
        module, ir.FunctionType(double, [double]), "llvm.fabs.f64")


def from_bf16(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """bfloat16 bits (``i16`` or a vector of them) widened to float32 (exact)."""
    count = bits.type.count if isinstance(bits.type, ir.VectorType) else None
    i32 = ir.VectorType(I32, count) if count else I32
    shift = ir.Constant(i32, [16] * count) if count else ir.Constant(I32, 16)
    return b.bitcast(b.shl(b.zext(bits, i32), shift), ir.VectorType(F32, count) if count else F32)


def convert_function(module: ir.Module, k: int) -> ir.Function:
    """``rnnc.bf16.convert.K(i64 rows, float* a, i16* abuf)``: ``abuf[r, :Kp] = bf16(a[r, :K])``
    rounded to nearest even, zero from ``K`` to ``Kp``."""
    fn, new = internal_function(module, f"rnnc.bf16.convert.{k}", [I64, F32.as_pointer(), BF16P])
    if not new:
        return fn
    rows, a, abuf = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    kp, lanes = padded_k(k), 16
    vec_f, vec_b = ir.VectorType(F32, lanes), ir.VectorType(I16, lanes)

    def row(r: ir.Value) -> None:
        src, dst = b.gep(a, [b.mul(r, _c(k))]), b.gep(abuf, [b.mul(r, _c(kp))])

        def vector(j: ir.Value) -> None:
            v = b.load(b.bitcast(b.gep(src, [j]), vec_f.as_pointer()), align=4)
            b.store(to_bf16(b, v), b.bitcast(b.gep(dst, [j]), vec_b.as_pointer()), align=2)

        whole = emit_loop(b, _c(0), _c(k), lanes, vector)

        def scalar(j: ir.Value) -> None:
            v = b.load(b.gep(src, [j]))
            b.store(to_bf16(b, v), b.gep(dst, [j]))

        emit_loop(b, whole, _c(k), 1, scalar)
        emit_loop(b, _c(k), _c(kp), 1, lambda j: b.store(ir.Constant(I16, 0), b.gep(dst, [j])))

    emit_loop(b, _c(0), rows, 1, row)
    b.ret_void()
    return fn


def pack_function(module: ir.Module, k: int, n: int, transposed: bool = False) -> ir.Function:
    """``rnnc.bf16.pack.KxN(float* w, i16* packed, float** marker, i64 first, i64 stop)``:
    panels ``first .. stop`` of ``w`` (K x N) packed into the VNNI pair layout, unless
    ``*marker`` is ``w`` already; ``*marker = w`` after.

    ``transposed`` (``rnnc.bf16.pack.KxN.t``): ``w`` is stored N x K and the matrix packed is
    its transpose, the weights of a gradient product ``g @ W^T``: a pair of K rows is then
    two adjacent floats of one stored row."""
    fptr = F32.as_pointer()
    fn, new = internal_function(module, f"rnnc.bf16.pack.{k}x{n}" + (".t" if transposed else ""),
                        [fptr, BF16P, fptr.as_pointer(), I64, I64])
    if not new:
        return fn
    w, packed, marker, first, stop = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    kp = padded_k(k)
    with b.if_then(b.icmp_unsigned("!=", b.load(marker), w)):
        # The panels inside w (whole), then the last one if it is partial (the edge).
        whole_end = _min(b, stop, _c(n // PANEL))
        if transposed:
            # A panel's pair rows read its 32 rows of w along their length.
            emit_loop(b, first, whole_end, 1, lambda p: emit_loop(
                b, _c(0), _c(k // 2), 1,
                lambda q: _pack_pair_transposed(b, w, packed, p, q, k, n)))
        else:
            # Pair by pair across the panels: w is read row after row, in the order of
            # memory (panel by panel it would be read down its columns, a row 4 KiB or more
            # from the next, which the hardware prefetchers do not follow).
            emit_loop(b, _c(0), _c(k // 2), 1, lambda q: emit_loop(
                b, first, whole_end, 1, lambda p: _pack_pair(b, w, packed, p, q, k, n)))
        emit_loop(b, first, whole_end, 1, lambda p: emit_loop(
            b, _c(k // 2), _c(kp // 2), 1,
            lambda q: _pack_edge(b, w, packed, p, q, k, n, transposed)))
        edge_start = b.select(b.icmp_signed(">", first, _c(n // PANEL)), first, _c(n // PANEL))
        emit_loop(b, edge_start, stop, 1, lambda p: emit_loop(
            b, _c(0), _c(kp // 2), 1,
            lambda q: _pack_edge(b, w, packed, p, q, k, n, transposed)))
        b.store(w, marker)
    b.ret_void()
    return fn


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _pair_row(b: ir.IRBuilder, packed: ir.Value, p: ir.Value, q: ir.Value, k: int) -> ir.Value:
    """The address of pair row ``q`` of panel ``p`` in the packed weights."""
    return b.gep(packed, [b.mul(b.add(b.mul(p, _c(padded_k(k) // 2)), q), _c(2 * PANEL))])


def _pack_pair(b: ir.IRBuilder, w: ir.Value, packed: ir.Value, p: ir.Value, q: ir.Value,
               k: int, n: int) -> None:
    """Pair row ``q`` of a panel inside ``w``: two rows of ``PANEL`` values, rounded and
    interleaved, in vectors."""
    vec = ir.VectorType(F32, PANEL)
    rows = [to_bf16(b, b.load(b.bitcast(b.gep(w, [b.add(b.mul(b.add(b.mul(q, _c(2)), _c(j)),
                                                                _c(n)), b.mul(p, _c(PANEL)))]),
                                        vec.as_pointer()), align=4)) for j in range(2)]
    order = [c // 2 + PANEL * (c % 2) for c in range(2 * PANEL)]
    pairs = b.shuffle_vector(rows[0], rows[1], ir.Constant(ir.VectorType(I32, 2 * PANEL), order))
    out = b.bitcast(_pair_row(b, packed, p, q, k), ir.VectorType(I16, 2 * PANEL).as_pointer())
    b.store(pairs, out, align=2)


def _pack_pair_transposed(b: ir.IRBuilder, w: ir.Value, packed: ir.Value, p: ir.Value,
                          q: ir.Value, k: int, n: int) -> None:
    """Pair row ``q`` of a panel inside ``w^T`` (``w`` stored N x K): per column, the pair is
    two adjacent floats of ``w``'s row, loaded, rounded and stored as one 32-bit word."""
    two_f, two_b = ir.VectorType(F32, 2), ir.VectorType(I16, 2)
    row = _pair_row(b, packed, p, q, k)
    for c in range(PANEL):
        col = b.add(b.mul(p, _c(PANEL)), _c(c))
        src = b.gep(w, [b.add(b.mul(col, _c(k)), b.mul(q, _c(2)))])
        pair = to_bf16(b, b.load(b.bitcast(src, two_f.as_pointer()), align=4))
        b.store(pair, b.bitcast(b.gep(row, [_c(2 * c)]), two_b.as_pointer()), align=2)


def _pack_edge(b: ir.IRBuilder, w: ir.Value, packed: ir.Value, p: ir.Value, q: ir.Value,
               k: int, n: int, transposed: bool = False) -> None:
    """Pair row ``q`` of a panel that reaches past ``w``'s last row or column: element by
    element, zero outside ``w``."""
    row = _pair_row(b, packed, p, q, k)
    for c in range(PANEL):
        col = b.add(b.mul(p, _c(PANEL)), _c(c))
        for j in range(2):
            kk = b.add(b.mul(q, _c(2)), _c(j))
            inside = b.and_(b.icmp_signed("<", kk, _c(k)), b.icmp_signed("<", col, _c(n)))
            # Out of w, the index is clamped to 0 so that the load stays inside.
            at = b.add(b.mul(col, _c(k)), kk) if transposed else b.add(b.mul(kk, _c(n)), col)
            index = b.select(inside, at, _c(0))
            value = b.select(inside, b.load(b.gep(w, [index])), ir.Constant(F32, 0))
            b.store(to_bf16(b, value), b.gep(row, [_c(2 * c + j)]))


GemmBuilder = Callable[[ir.Module, int | None, int], ir.Function]


def gemm_function(module: ir.Module, tier: Tier, k: int | None, n: int) -> ir.Function:
    """The tier's ``gemm(i64 rows, i16* abuf, i16* packed, float* out, i64 first, i64 stop)``:
    ``out[:rows, cols] = abuf[:rows] @ packed`` for the columns of panels ``first .. stop``
    (``out`` is rows x N, float32). ``k=None``: a depth known only at the call, passed as a
    last argument ``i64 k`` (the weight gradients, :mod:`rnnc.backends.llvm.bf16_wgrad`)."""
    from rnnc.backends.llvm import amx, dpbf16

    if tier not in TIERS:
        raise ValueError(f"bf16 tier must be one of {TIERS}, got {tier!r}")
    builders: dict[str, GemmBuilder] = {
        "amx": amx.gemm_function,
        "avx512bf16": lambda m, kk, nn: dpbf16.gemm_function(m, kk, nn, native=True),
        "emulate": lambda m, kk, nn: dpbf16.gemm_function(m, kk, nn, native=False)}
    return builders[tier](module, k, n)


__all__ = ["BF16", "BF16P", "K_BLOCK", "PANEL", "TIERS", "convert_function", "from_bf16",
           "gemm_function", "host_tier", "internal_function", "pack_function", "packed_words",
           "padded_k", "panel_count", "request_amx", "to_bf16", "with_target_features"]
