"""How a backend runs a program: every decision that is not *what* it computes, as one value.

A :class:`Schedule` is a frozen dataclass per (program, backend, options, shape class): thread
team and its split, the panel kernel's limits against the BLAS, the fused step, the persistent
kernel, when a ``linear_scan`` takes its chunked form and with which block, launch geometry,
and the precision. The passes decide what a program computes; the schedule decides how. A new
decision of how to run belongs here, not in a module constant, a constructor flag or a runtime
check, kernel tile sizes included (``LlvmSchedule.gemm_row_block``); a module constant is
left only for a fact (a table's layout, a hardware limit), its comment saying so.

- A backend derives the default for a program: ``backend.schedule(program, mode)``. Its
  options fill the schedule's ``None`` fields (``threads=``, ``team=``, ``fused_step=``, ...);
  the rest are the defaults below, chosen from measurements written next to each field.
- A user or a test forces a path by giving one: ``rnnc.compile(cell, backend="llvm",
  schedule=LlvmSchedule(threads=2, team_min_work=0))``; fields it leaves ``None`` still come
  from the options, and a field given both ways is an error.
- Lowering and the runner read it (``backends/llvm/codegen.py``, ``backends/cuda/runtime.py``);
  the code cache key hashes :meth:`Schedule.key`; autotune searches over
  ``dataclasses.replace`` of it; ``rnnc dump --schedule`` prints :meth:`Schedule.describe`.

Fields whose metadata says ``per_call`` are thresholds a runner compares with each call's
sizes (the shape class): they change no generated code, so :meth:`Schedule.key` leaves them
out. docs/architecture.md, "How to add a schedule choice", walks through one field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from rnnc import ops
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.ir import FUSED, Graph, Program

# Read per call, compiled into nothing: left out of the code cache key.
_PER_CALL = {"per_call": True}


@dataclass(frozen=True)
class Schedule:
    """The decisions every backend has: the precision of its products."""

    # The precision of the GEMMs (rnnc.precision): "fp32", every product in the program's
    # dtype; "bf16", bfloat16 operands and float32 sums (a program's matmuls say so); a
    # backend may accept more ("tf32"). "highest" is read as "fp32".
    precision: str | None = None

    # The precisions this backend runs; a subclass widens it.
    PRECISIONS = ("fp32", "bf16")

    def __post_init__(self) -> None:
        if self.precision == "highest":
            object.__setattr__(self, "precision", "fp32")
        if self.precision is not None and self.precision not in self.PRECISIONS:
            raise RnncValueError(f"precision must be one of "
                                 f"{', '.join(map(repr, self.PRECISIONS))}, got "
                                 f"{self.precision!r}")

    def key(self, per_call: bool = False) -> str:
        """Stable text of every field compiled into code (not ``per_call``; every field with
        ``per_call``), by name: what cache keys hash in place of hand-assembled parts."""
        return type(self).__name__ + "(" + ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
            if per_call or not f.metadata.get("per_call")) + ")"

    def describe(self) -> str:
        """One line per field, ``name = value``, per-call thresholds marked."""
        return "\n".join(f"{f.name} = {getattr(self, f.name)!r}"
                         + ("  (per call)" if f.metadata.get("per_call") else "")
                         for f in fields(self))

    def merged(self, options: dict[str, Any]) -> Schedule:
        """This schedule with its ``None`` fields set from the backend ``options`` (by field
        name; None: not given); RnncValueError where a field is given both ways."""
        twice = sorted(name for name, value in options.items()
                       if value is not None and getattr(self, name) is not None)
        if twice:
            raise RnncValueError(f"{twice[0]} is given both as a backend option and in "
                                 f"schedule=; give it once")
        return dataclasses.replace(self, **{n: v for n, v in options.items() if v is not None})


def gemm_precision(program: Program) -> str:
    """The precision of ``program``'s products: "bf16" where a matmul of any graph (or fused
    region) has bfloat16 operands (rnnc.precision marks every matmul alike), else "fp32"."""
    def bf16(g: Graph) -> bool:
        return any(node.attrs.get("precision") == "bf16" if node.op is ops.matmul
                   else node.op is FUSED and bf16(node.attrs["region"]) for node in g.nodes())

    return "bf16" if any(map(bf16, (program.pre, program.scan.body, program.post))) else "fp32"


def given(schedule: Any, kind: type[Schedule], backend: str) -> Schedule:
    """The ``schedule=`` option of ``backend``: ``kind()`` for None, else checked."""
    if schedule is None:
        return kind()
    if type(schedule) is not kind:
        raise RnncTypeError(f"backend {backend!r} takes schedule={kind.__name__}(...) "
                            f"(rnnc.backends.schedule), got {type(schedule).__name__}")
    return schedule


def _positive(schedule: Schedule, *names: str) -> None:
    """RnncValueError unless each field of ``names`` is a whole number >= 0."""
    for name in names:
        value = getattr(schedule, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RnncValueError(f"{name} must be a whole number >= 0, got {value!r}")


@dataclass(frozen=True)
class LlvmSchedule(Schedule):
    """How the LLVM backend runs a program (docs/threads.md)."""

    # Threads of the BLAS and of the team (``threads=``; default $RNNC_THREADS or the cores).
    threads: int | None = None
    # Whether a sequence may run on a team of ``threads`` threads (``team=``, $RNNC_TEAM).
    team: bool | None = field(default=None, metadata=_PER_CALL)
    # How a team splits a gated cell's step: "columns" (the recurrent product by column
    # panels, a barrier, the elementwise region by batch rows, a barrier) or "units" (each
    # thread its hidden units in every gate, one barrier; slower on the 2-core machine it was
    # measured on).
    team_split: str | None = None
    # Multiply-adds of one step's recurrent products (B times the weights' sizes) from which
    # a sequence runs on the team; below it, a team spends more time meeting than working.
    team_min_work: int = field(default=1 << 22, metadata=_PER_CALL)
    # A sequence also runs on the team, its products below team_min_work or none, when the
    # pre- and post-loop graphs' linear_scan nodes make at least scan_team_min_work
    # multiply-adds (T * B times their features) and the narrowest is split by columns, each
    # thread's columns of one step being at least scan_thread_min_bytes, or, its columns
    # fewer, over its steps, with at least scan_chunk_min_steps steps a thread and
    # scan_chunk_min_work multiply-adds. The scan is memory-bound: on a 2-core VM
    # (docs/passes.md) the split by columns lost below about 1 Mi multiply-adds (the team's
    # start and two barriers, about 60 us), and at every size where the threads' columns of a
    # step share pages (B * features of 512 floats: 0.4-0.7x). The split over steps reads the
    # chunks but the last twice: at B * features of 512 floats it ran the scan at 0.9x at 2
    # and 4 Mi multiply-adds, 1.1-1.2x at 8 Mi. The two limits in bytes and steps are
    # compiled into the team build (it makes the same choice).
    scan_team_min_work: int = field(default=1 << 21, metadata=_PER_CALL)
    scan_thread_min_bytes: int = 4096
    scan_chunk_min_steps: int = 64
    scan_chunk_min_work: int = field(default=1 << 23, metadata=_PER_CALL)
    # A scan split over its steps gives thread 0 (one pass over its steps; the others make
    # two) this many sixteenths of each other thread's steps (docs/passes.md, parallel-scan).
    scan_first_chunk_weight: int = 48
    # Up to this many multiply-adds per step (rows * n * k) the panel kernel on one core beats
    # a BLAS on several: the limit of the one-thread build of a backend with threads > 1.
    panel_max_work: int = 12 << 20
    # Where the BLAS would run on one core too (threads=1, or a team thread on its own
    # columns) the panel kernel wins far beyond that: it packs the weights once per call, a
    # BLAS call packs them on every step. Measured on a 2-core AMD EPYC (AVX-512), LSTM,
    # H = 512, one thread: 98-101 GFLOP/s with the panel kernel against 79-96 with OpenBLAS
    # from B = 32 to 512 (rows * n * k up to 512 Mi); a C1 LSTM on a team of two, 152 -> 139 ms.
    one_core_panel_max_work: int = 1 << 30
    # Up to this many rows, a GEMM runs in the axpy-form kernel instead of the panel kernel or
    # the BLAS: the BLAS call overhead and its small-M paths lose there.
    gemm_small_rows: int = 2
    # The panel kernel's row block: 2 * rows accumulators + 2 weight vectors + 1 broadcast fit
    # in the 32 zmm registers of AVX-512 (more rows spill, fewer reload the panel more often).
    gemm_row_block: int = 6
    # Panel rows per chunk: 2 * lanes * gemm_k_chunk values (32 KiB of float32 at 16 lanes)
    # stay in L1 across the row tiles.
    gemm_k_chunk: int = 256
    # A fused region of more nodes is emitted as several loops, each at most this many nodes:
    # the compile time of one loop body grows faster than linearly with its size (a 1,000-op
    # body took 17 s), while storing and reloading a value between loops costs little.
    kernel_nodes: int = 128
    # Kernels are inlined into ``rnnc_run`` while it calls at most this many: LLVM's optimizer
    # and instruction selection grow faster than linearly with the size of one function (a
    # cell of 300 chained matmuls, all inlined, took minutes to compile), while a call costs
    # nanoseconds.
    inline_call_sites: int = 64
    # The team build's one workspace slot shared by every scan split over its steps, in bytes
    # (scan_chunks.BUFFERS_PER_THREAD column vectors a thread); a scan whose team it cannot
    # hold is split by columns. Not tuned: pages of the slot that no thread touches cost no
    # memory, and 4 MiB holds a team of 8 on B * features of 32 Ki float32.
    scan_workspace_bytes: int = 4 << 20
    # Which BLAS runs a GEMM call at how many threads is measured per shape (LLVM autotune,
    # backends/llvm/autotune.py) among the candidates these bounds leave: up to
    # blas_one_thread_max_work multiply-adds (m * n * k) only one thread (a tiny product cannot
    # pay for a thread hand-off), from blas_all_threads_min_work only all of them (a huge one
    # always gains from every core). Unmeasured bounds; between them, timings decide.
    blas_one_thread_max_work: int = field(default=1 << 16, metadata=_PER_CALL)
    blas_all_threads_min_work: int = field(default=1 << 27, metadata=_PER_CALL)

    TEAM_SPLITS = ("columns", "units")
    MAX_THREADS = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or not 1 <= threads <= self.MAX_THREADS):
            raise RnncValueError(f"threads must be a whole number of BLAS threads from 1 to "
                                 f"{self.MAX_THREADS}, got {threads!r}")
        if self.team is not None and not isinstance(self.team, bool):
            raise RnncTypeError(f"team must be True or False, got {self.team!r}")
        if self.team_split is not None and self.team_split not in self.TEAM_SPLITS:
            raise RnncValueError(f"team_split must be one of "
                                 f"{', '.join(map(repr, self.TEAM_SPLITS))}, got "
                                 f"{self.team_split!r}")
        _positive(self, "team_min_work", "scan_team_min_work", "scan_thread_min_bytes",
                  "scan_chunk_min_steps", "scan_chunk_min_work", "panel_max_work",
                  "one_core_panel_max_work", "scan_first_chunk_weight", "gemm_small_rows",
                  "gemm_row_block", "gemm_k_chunk", "kernel_nodes", "inline_call_sites",
                  "scan_workspace_bytes", "blas_one_thread_max_work",
                  "blas_all_threads_min_work")
        for name in ("scan_first_chunk_weight", "gemm_row_block", "gemm_k_chunk",
                     "kernel_nodes"):
            if getattr(self, name) == 0:
                raise RnncValueError(f"{name} must be at least 1, got 0")

    def for_build(self, team: bool) -> LlvmSchedule:
        """The schedule as one build reads it, every other field at its default, so that
        backends whose schedules differ only elsewhere share code: the team build (``team``)
        or the one-thread build, which reads ``threads`` only as whether it is 1."""
        default = LlvmSchedule()
        read = {name: getattr(self, name) for name in (
            "precision", "one_core_panel_max_work", "gemm_small_rows", "gemm_row_block",
            "gemm_k_chunk", "kernel_nodes", "inline_call_sites")}
        if team:
            read.update(team_split=self.team_split, scan_workspace_bytes=self.scan_workspace_bytes,
                        scan_thread_min_bytes=self.scan_thread_min_bytes,
                        scan_chunk_min_steps=self.scan_chunk_min_steps,
                        scan_first_chunk_weight=self.scan_first_chunk_weight)
        else:
            read.update(threads=1 if self.threads == 1 else default.threads,
                        panel_max_work=self.panel_max_work)
        return dataclasses.replace(default, **read)

    def scan_limits(self) -> tuple[int, int, int] | None:
        """What a team build needs to split a linear_scan over its steps (bytes, steps, first
        chunk's weight: :class:`rnnc.backends.llvm.team.Team`); None without a limit in
        bytes, where every scan is split by columns and the split over steps is not built."""
        if not self.scan_thread_min_bytes:
            return None
        return (self.scan_thread_min_bytes, self.scan_chunk_min_steps,
                self.scan_first_chunk_weight)

    def own_max_work(self, one_core: bool) -> int:
        """The panel kernel's limit in a build whose BLAS calls run on one core or not."""
        return self.one_core_panel_max_work if one_core else self.panel_max_work


@dataclass(frozen=True)
class CudaSchedule(Schedule):
    """How the CUDA backend runs a program (backends/cuda/runtime.py)."""

    PRECISIONS = ("fp32", "bf16", "tf32")  # and TF32 GEMMs (.cuda.precision)
    FUSED_STEPS = ("auto", "always", "never", "persistent")

    # How a step runs its recurrent product where the region reading it is unit-local:
    # "never" (a GEMM and an elementwise kernel), "always" (one fused kernel), "persistent"
    # (the whole loop in one cooperative launch) or "auto" (timed per shape on a GPU, autotune
    # choosing among the schedules with each of the others).
    fused_step: str | None = None
    # Threads per block of a one-thread-per-element (or per-row) kernel, and the most blocks
    # of one launch: its grid-stride loop covers the rest, and 8192 blocks fill any current
    # GPU. Such kernels do not need tuning here.
    block_threads: int = field(default=256, metadata=_PER_CALL)
    max_blocks: int = field(default=8192, metadata=_PER_CALL)
    # The most resident blocks a persistent launch uses; 0: as many as the device holds.
    persistent_max_blocks: int = field(default=0, metadata=_PER_CALL)
    # The chunked linear_scan kernel's block (backends/cuda/scan.py): scan_columns adjacent
    # columns by scan_chunks chunks of the steps. Untuned until measured on a GPU. 32 columns:
    # one warp reads 32 adjacent elements of a step (128 bytes of float32). 32 chunks: 1024
    # threads, the most a block may have, so a narrow scan (B = 1, a few hundred features)
    # still has thousands of threads; the shared memory is 2 x 1024 values (16 KiB in f64).
    scan_columns: int = 32
    scan_chunks: int = 32
    # A linear_scan runs its chunked kernel (backends/cuda/scan.py) below this many columns
    # (batch rows x features) and from this many steps. Untuned until measured on a GPU. From
    # 32 Ki columns on, the columns' own threads fill an H100 far enough that a second read of
    # A and Bv costs more than the shorter chain gains; below 2 steps per chunk the barriers
    # and the second pass outweigh the chain they shorten.
    scan_chunked_max_columns: int = field(default=32 * 1024, metadata=_PER_CALL)
    scan_chunked_min_steps: int = field(default=2 * 32, metadata=_PER_CALL)
    # Steps of the loop one CUDA graph holds (backends/cuda/graphs.py; graph=True): a loop of
    # at most this many is one graph of the whole call, a longer one replays a graph of this
    # many steps T / graph_steps times, re-pointed. A graph this long launches in one call and
    # holds a few hundred nodes per launch of a step. Untuned; the runner reads it, no
    # kernel's source does.
    graph_steps: int = field(default=256, metadata=_PER_CALL)
    # A fused step's tile (backends/cuda/fused_tile.py): tile_row_threads threads of a block
    # along the batch rows; at most tile_max_units along the hidden units, 32 so that a warp
    # spans consecutive units (coalesced loads of b and stores of results); the deepest stage
    # of K from tile_depths (deepest first) that fits in static shared memory. A persistent
    # kernel's tile takes the same limits. Untuned until measured on a GPU.
    tile_row_threads: int = 8
    tile_max_units: int = 32
    tile_depths: tuple[int, ...] = (16, 8, 4, 2, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fused_step is not None and self.fused_step not in self.FUSED_STEPS:
            raise RnncValueError(f"fused_step must be one of "
                                 f"{', '.join(map(repr, self.FUSED_STEPS))} (how a step's "
                                 f"product and its epilogue run: timed, one kernel, GEMM + "
                                 f"kernel, or one kernel for the whole loop), got "
                                 f"{self.fused_step!r}")
        _positive(self, "block_threads", "max_blocks", "persistent_max_blocks",
                  "scan_chunked_max_columns", "scan_chunked_min_steps", "graph_steps")
        if self.graph_steps == 0:
            raise RnncValueError("graph_steps must be at least 1 (steps of one CUDA graph)")
        if not (1 <= self.block_threads <= 1024 and self.max_blocks >= 1):
            raise RnncValueError(f"block_threads must be from 1 to 1024 and max_blocks at "
                                 f"least 1, got {self.block_threads} and {self.max_blocks}")
        _positive(self, "tile_row_threads", "tile_max_units")
        depths = self.tile_depths
        if not (isinstance(depths, tuple) and depths and all(
                type(d) is int and d >= 1 for d in depths) and list(depths) == sorted(
                set(depths), reverse=True) and depths[-1] == 1):
            raise RnncValueError(f"tile_depths must be a tuple of whole numbers, deepest first, "
                                 f"ending in 1, got {depths!r}")
        units = self.tile_max_units
        if not (1 <= self.tile_row_threads * units <= 1024 and units & (units - 1) == 0):
            raise RnncValueError(f"tile_row_threads times tile_max_units (a power of two) must "
                                 f"make 1 to 1024 threads (a block), got "
                                 f"{self.tile_row_threads} x {units}")
        _positive(self, "scan_columns", "scan_chunks")
        if not (self.scan_columns >= 1 and self.scan_chunks >= 2
                and self.scan_columns * self.scan_chunks <= 1024):
            raise RnncValueError(f"scan_columns >= 1 times scan_chunks >= 2 must make at most "
                                 f"1024 threads (a block), got {self.scan_columns} x "
                                 f"{self.scan_chunks}")
