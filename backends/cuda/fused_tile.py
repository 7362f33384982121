"""One tile of one step's recurrent product, as a CUDA device function a kernel calls.

A step of a gated cell multiplies the carried state ``a`` (B, K) by the gates' matrices side by
side, ``b`` (K, G*H): ``P = a @ b``, gate ``g`` in columns ``g*H + [0, H)``. A fused step
(:mod:`.fused_step`) gives each block the batch rows ``[r0, r0 + rows)`` and the hidden units
``[u0, u0 + units)``; the block needs the product columns ``g*H + [u0, u0 + units)`` of every gate
and nothing else. :func:`tile_function` writes the device function computing them::

    __device__ __forceinline__ void k_3_tile(const float* __restrict__ a,
            const float* __restrict__ b, long long B, long long r0, long long u0,
            float (&acc)[4][4], float* __restrict__ tile_a, float* __restrict__ tile_b)

Thread ``t`` of the block owns one unit, ``u0 + t % units``, and ``rows_per_thread`` rows,
``r0 + (t / units) * rows_per_thread + i``; it ends with ``acc[g][i]``, the product at row ``i``
and gate ``g`` of its unit, in registers. The contraction axis K goes through shared memory
``depth`` columns at a time (``tile_a``: rows x depth of ``a``, ``tile_b``: depth x G*units of
``b``), with a ``__syncthreads()`` after loading a stage and after using it. Rows past ``B``,
units past ``H`` and columns past ``K`` load zeros, so edge tiles need no other care, but every
thread of the block must call the function. ``transpose_b`` reads ``b`` stored as (G*H, K)
(``h @ U.T``, tied weights).

With ``bf16`` (``matmul[precision=bf16]``, :mod:`.bf16`) ``b`` holds bfloat16 bits (unsigned
short): the function rounds each element of ``a`` to bfloat16 as it stores it in ``tile_a``
and widens each weight to float32 as it reads it; the products (exact in float32) and the sums
stay float32. ``tile_b`` stays float32; a persistent kernel's slice keeps the 16-bit bits, so
twice the weights fit in its shared memory.

The function takes its shared buffers and sizes as arguments and knows nothing of the epilogue,
so a kernel that loops over the time steps itself (a persistent kernel) can call it once per
step. :func:`choose_tile` picks the tile sizes from H, G, K and the element size.
"""

from __future__ import annotations

from dataclasses import dataclass

from rnnc.backends.schedule import CudaSchedule

# The threads along the rows, the most units and the stage depths are the schedule's
# (CudaSchedule.tile_row_threads, .tile_max_units, .tile_depths). A fact of every CUDA GPU:
# the static shared memory a block may declare without opting in to more.
SHARED_BYTES = 48 * 1024


@dataclass(frozen=True)
class Tile:
    """The sizes of one block's tile of a step: G gates of ``units`` units for ``rows`` rows."""

    H: int  # hidden units (the product has G*H columns)
    G: int  # gates
    K: int  # the contraction axis
    units: int  # hidden units per block, one per thread along that axis
    rows_per_thread: int
    depth: int  # columns of K per shared-memory stage
    row_threads: int = CudaSchedule.tile_row_threads  # threads along the rows

    @property
    def rows(self) -> int:
        """Batch rows per block."""
        return self.row_threads * self.rows_per_thread

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.row_threads * self.units

    @property
    def unit_blocks(self) -> int:
        """Blocks along the hidden units: a grid has this many per block of rows."""
        return -(-self.H // self.units)

    def blocks(self, batch: int) -> int:
        """The grid of a step with ``batch`` rows: every (rows, units) block."""
        return -(-batch // self.rows) * self.unit_blocks

    def shared_bytes(self, itemsize: int) -> int:
        """The static shared memory of the two stage buffers."""
        return (self.rows + self.G * self.units) * self.depth * itemsize


def choose_tile(H: int, G: int, K: int, itemsize: int, how: CudaSchedule | None = None
                ) -> Tile | None:
    """The tile of a step with G gates of H units over K, or None when even the smallest stage
    does not fit in static shared memory (the step then keeps its GEMM); ``how``'s limits."""
    how = how or CudaSchedule()
    units = min(how.tile_max_units, 1 << max(H - 1, 0).bit_length())
    # Fewer rows per thread for many gates: a thread's accumulators stay in registers.
    rows_per_thread = 4 if G <= 8 else 2 if G <= 16 else 1
    widest = max(1, 1 << max(K - 1, 0).bit_length())  # no deeper stage than K needs
    for depth in how.tile_depths:
        if depth > widest and depth != how.tile_depths[-1]:
            continue
        tile = Tile(H, G, K, units, rows_per_thread, depth, how.tile_row_threads)
        if tile.shared_bytes(itemsize) <= SHARED_BYTES:
            return tile
    return None


def b_index(tile: Tile, transpose_b: bool) -> str:
    """The C index of element (k, column g*H + u) of ``b``, (K, G*H) or transposed."""
    if transpose_b:
        return f"(g * {tile.H} + u) * {tile.K} + k"
    return f"k * {tile.G * tile.H} + g * {tile.H} + u"


def padded_depth(tile: Tile) -> int:
    """K rounded up to whole stages: the rows of a block's slice of ``b`` in shared memory."""
    return -(-tile.K // tile.depth) * tile.depth


def tile_function(name: str, tile: Tile, ctype: str, transpose_b: bool,
                  b_shared: bool = False, bf16: bool = False) -> str:
    """The device function ``name`` computing one tile into ``acc`` (see the module doc).

    With ``b_shared`` the function reads ``b`` from the block's slice in shared memory,
    ``padded_depth`` x G*units laid out as ``tile_b`` is (zeros past K and H), loaded once by
    a persistent kernel; it then has no ``tile_b`` and ``a`` is no ``__restrict__`` pointer:
    other blocks of the same launch wrote it, so it must not be read through the read-only
    cache. With ``bf16``, ``b`` (and the shared slice) holds bfloat16 bits (module doc)."""
    t, G, TM, U, D = ctype, tile.G, tile.rows_per_thread, tile.units, tile.depth
    a_param = f"const {t}* a" if b_shared else f"const {t}* __restrict__ a"
    b_type = "unsigned short" if bf16 else t
    buffers = f"{t}* __restrict__ tile_a" + ("" if b_shared else f", {t}* __restrict__ tile_b")
    a_value, weight = _reads(tile, b_shared, bf16)
    lines = [
        f"// One tile of P = a @ b{'^T' if transpose_b else ''}: rows [r0, r0 + {tile.rows}), "
        f"columns g*{tile.H} + [u0, u0 + {U}) of {G} gates,",
        f"// over K = {tile.K} in stages of {D}; acc[g][i] is row i of this thread's unit. "
        f"Every thread of the block calls it.",
        f"__device__ __forceinline__ void {name}(",
        f"    {a_param}, const {b_type}* __restrict__ b, long long B, long long r0,",
        f"    long long u0, {t} (&acc)[{G}][{TM}], {buffers}) {{",
        "    const int unit = threadIdx.x % " + str(U) + ";",
        f"    const int first = (threadIdx.x / {U}) * {TM};",
        "    #pragma unroll",
        f"    for (int g = 0; g < {G}; ++g) {{",
        "        #pragma unroll",
        f"        for (int i = 0; i < {TM}; ++i) acc[g][i] = {'0.0f' if t == 'float' else '0.0'};",
        "    }",
        f"    for (int k0 = 0; k0 < {tile.K}; k0 += {D}) {{",
        f"        for (int e = threadIdx.x; e < {tile.rows * D}; e += {tile.threads}) {{",
        f"            const long long r = r0 + e / {D};",
        f"            const int k = k0 + e % {D};",
        f"            tile_a[e] = (r < B && k < {tile.K}) ? {a_value} : ({t})0;",
        "        }",
        *([] if b_shared else load_b_lines("tile_b", "k0", D, tile, t, transpose_b,
                                           "rnnc_bf16_float" if bf16 else "")),
        "        __syncthreads();",
        "        #pragma unroll",
        f"        for (int kk = 0; kk < {D}; ++kk) {{",
        f"            {t} row_values[{TM}];",
        "            #pragma unroll",
        f"            for (int i = 0; i < {TM}; ++i) "
        f"row_values[i] = tile_a[(first + i) * {D} + kk];",
        "            #pragma unroll",
        f"            for (int g = 0; g < {G}; ++g) {{",
        f"                const {t} weight = {weight};",
        "                #pragma unroll",
        f"                for (int i = 0; i < {TM}; ++i) acc[g][i] += row_values[i] * weight;",
        "            }",
        "        }",
        "        __syncthreads();",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _reads(tile: Tile, b_shared: bool, bf16: bool) -> tuple[str, str]:
    """The C expressions of the tile function's element of ``a`` (at row r, column k) and
    of ``b`` (at stage row kk, gate g, the thread's unit), rounded or widened for ``bf16``."""
    GU, U = tile.G * tile.units, tile.units
    weight = f"b[(k0 + kk) * {GU} + g * {U} + unit]" if b_shared else \
        f"tile_b[kk * {GU} + g * {U} + unit]"
    a_value = f"a[r * {tile.K} + k]"
    if not bf16:
        return a_value, weight
    # tile_b holds float32 already; a slice in shared memory keeps the bits.
    return f"rnnc_round_bf16({a_value})", \
        f"rnnc_bf16_float({weight})" if b_shared else weight


def load_b_lines(buffer: str, k0: str, depth: int, tile: Tile, ctype: str, transpose_b: bool,
                 convert: str = "") -> list[str]:
    """A block's loop loading rows ``[k0, k0 + depth)`` of its columns of ``b`` into
    ``buffer`` (depth x G*units of ``ctype``, zeros past K and H), each element through the
    function ``convert`` where one is named."""
    G, U = tile.G, tile.units
    value = f"b[{b_index(tile, transpose_b)}]"
    if convert:
        value = f"{convert}({value})"
    return [
        f"        for (int e = threadIdx.x; e < {depth * G * U}; e += {tile.threads}) {{",
        f"            const int k = {k0} + e / {G * U};",
        f"            const int g = (e % {G * U}) / {U};",
        f"            const long long u = u0 + e % {U};",
        f"            {buffer}[e] = (k < {tile.K} && u < {tile.H}) ? {value} : ({ctype})0;",
        "        }",
    ]
