"""Differential testing: every backend and pipeline against the float64 oracle.

The oracle is ``rnnc.compile(cell, backend="numpy", optimize=False)``: the traced program
interpreted with no optimizing pass (only mask-lengths for lengths and autodiff for training),
in float64, itself checked against :mod:`tests.fuzz.reference`. A *target* is a backend under
test; each runs in float32 and float64, with and without lengths, through inference
(``fn(x, params, states=, lengths=)``), the training forward (``fn.forward``) and the backward
(``fn.backward`` with random output and state cotangents). Outputs, final states and every
gradient (``g.x``, ``g.params``, ``g.states``) are compared with the oracle's.

Errors are measured relative to scale, ``max|got - want| / max(1, max|want|)`` per array:
- float64 targets: ``TOLERANCE["float64"] = 1e-9``. Reassociated sums, BLAS blocking and
  rnnc's own exp/tanh (under 2.4 ULP) move results by ~1e-15 relative (the largest seen over
  thousands of cells is 2e-15); a few steps of recurrence and backward amplify that by at most
  ~1e3 on these bounded cells.
- float32 targets against the float64 oracle: ``TOLERANCE["float32"] = 1e-4``. Rounding the
  inputs and float32 arithmetic give at most ~1e-6 on these cells (values squashed into O(1),
  denominators >= 0.5, a few steps; the largest seen over thousands of cells and every
  backend is 8e-7), so the tolerance leaves two orders of magnitude for unlucky conditioning,
  while the miscompilations this fuzzer exists for (a dropped or doubled bias, a wrong slice)
  give 1e-3 to 1.
- bfloat16 GEMMs (``precision="bf16"``, drawn for one seed in four: :func:`drawn_precision`):
  the target and the oracle both compile with ``precision="bf16"`` and run in float32 (the
  oracle rounds every GEMM operand to bfloat16 and sums in float32), ``TOLERANCE["bf16"] =
  1e-4``, float32's: they agree to float32 rounding (the largest seen over 100 bf16 cells on
  NumPy and LLVM is 4e-7). An operand within float32 rounding of a bfloat16 rounding boundary
  could round to neighbouring bfloat16 values in the two (2^-8 apart, ~1e-3 on a result); no
  fuzzed cell has come that close yet: such a report is that, not a miscompilation.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import rnnc
import rnnc.backends
from tests.fuzz.cells import generate
from tests.fuzz.reference import evaluate, group
from tests.fuzz.spec import CellSpec, build

TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bf16": 1e-4}
BF16_SHARE = 0.25  # the share of seeds whose cells compile with precision="bf16"
MARGIN = 1e-4
COMBOS = tuple((dtype, masked) for dtype in ("float32", "float64") for masked in (False, True))
PIPELINES = ("inference", "forward", "backward")


@dataclass(frozen=True)
class Target:
    """A backend under test: ``compile(cell, precision=...)`` returns an ``rnnc.Function``-like
    object."""

    name: str
    compile: Callable[[rnnc.Cell], Any]

    def available(self) -> str | None:
        """None, or why this target cannot run on this machine."""
        if self.name.startswith("llvm"):
            try:
                import llvmlite  # noqa: F401
            except ImportError:
                return "llvmlite is not installed"
        if self.name == "cuda-emulate" and shutil.which("g++") is None:
            return "CUDA emulation needs g++"
        if self.name == "cuda":
            try:
                rnnc.backends.get("cuda")
            except rnnc.BackendUnavailable as err:
                return str(err)
        return None


TARGETS = {
    "numpy": Target("numpy", lambda cell, **o: rnnc.compile(cell, backend="numpy", **o)),
    # Memory-only code cache: every run compiles the code generators as they are now.
    "llvm": Target("llvm", lambda cell, **o: rnnc.compile(cell, backend="llvm", cache_dir=False,
                                                          **o)),
    # LLVM leaves parallel-scan off by default (backends/llvm/runtime.py); this target turns it
    # on, so that its linear_scan kernels meet fuzzed cells too.
    "llvm-scan": Target("llvm-scan", lambda cell, **o: rnnc.compile(
        cell, backend="llvm", cache_dir=False, parallel_scan=True, **o)),
    "cuda-emulate": Target("cuda-emulate",
                           lambda cell, **o: rnnc.compile(cell, backend="cuda", emulate=True,
                                                          **o)),
    "cuda": Target("cuda", lambda cell, **o: rnnc.compile(cell, backend="cuda", **o)),
}


def oracle(cell: rnnc.Cell, precision: str = "fp32") -> rnnc.Function:
    return rnnc.compile(cell, backend="numpy", optimize=False, precision=precision)


def drawn_precision(seed: int) -> str:
    """The compile option ``precision`` of the cells checked with ``seed``: "bf16" for about
    one seed in four (:data:`BF16_SHARE`), else "fp32"."""
    return "bf16" if np.random.default_rng([seed, 3]).random() < BF16_SHARE else "fp32"


@dataclass(frozen=True)
class Case:
    """A cell and the sizes and seed of the data it runs on."""

    spec: CellSpec
    T: int
    B: int
    seed: int


def case(seed: int) -> Case:
    """The fuzz case of ``seed``: its random cell, T in 1..5 (mostly 4), B in 1..3."""
    rng = np.random.default_rng([seed, 1])
    return Case(generate(seed), int(rng.choice([1, 2, 3, 4, 4, 4, 5])), int(rng.integers(1, 4)),
                seed)


@dataclass
class Data:
    """Float64 inputs, parameters, initial states, lengths and cotangents for one cell."""

    xs: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    lengths: np.ndarray
    d_outputs: dict[str, np.ndarray]
    d_states: dict[str, np.ndarray]


def make_data(cell: rnnc.Cell, T: int, B: int, seed: int) -> Data:
    """Data for ``cell`` from ``seed`` alone (deterministic)."""
    rng = np.random.default_rng([seed, 2])
    xs = {n: rng.standard_normal((T, B, s[-1])) for n, s in cell.sizes("input").items()}
    states = {n: rng.uniform(-0.5, 0.5, (B, s[-1])) for n, s in cell.sizes("state").items()}
    lengths = rng.integers(1, T + 1, B)
    if T > 1 and (lengths == T).all():
        lengths[rng.integers(B)] = rng.integers(1, T)
    widths = {n: cell.graph.node(i).shape[-1] for n, i in cell.outputs.items()}
    d_outputs = {n: rng.standard_normal((T, B, w)) for n, w in widths.items()}
    d_states = {n: rng.standard_normal(s.shape) for n, s in states.items()}
    return Data(xs, cell.init_params(seed=seed, dtype=np.float64), states, lengths, d_outputs,
                d_states)


def _cast(arrays: Mapping[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {n: np.ascontiguousarray(a, dtype=dtype) for n, a in arrays.items()}


def run_pipelines(fn: Any, data: Data, dtype: str, masked: bool,
                  pipelines: tuple[str, ...] = PIPELINES) -> dict[str, np.ndarray]:
    """Every compared array of ``fn`` on ``data`` in ``dtype``, by a readable name."""
    xs = _cast(data.xs, dtype)
    x = next(iter(xs.values())) if len(xs) == 1 else xs
    args = (x, _cast(data.params, dtype))
    kwargs = {"states": _cast(data.states, dtype), "lengths": data.lengths if masked else None}
    out: dict[str, np.ndarray] = {}
    if "inference" in pipelines:
        ys, states = fn(*args, **kwargs)
        out.update({f"inference y[{n}]": v for n, v in ys.items()})
        out.update({f"inference state[{n}]": v for n, v in states.items()})
    if "forward" in pipelines or "backward" in pipelines:
        ys, states, tape = fn.forward(*args, **kwargs)
        out.update({f"forward y[{n}]": v for n, v in ys.items()})
        out.update({f"forward state[{n}]": v for n, v in states.items()})
    if "backward" in pipelines:
        g = fn.backward(tape, d_outputs=_cast(data.d_outputs, dtype),
                        d_states=_cast(data.d_states, dtype))
        gx = g.x if isinstance(g.x, dict) else {next(iter(data.xs)): g.x}
        out.update({f"backward g.x[{n}]": v for n, v in gx.items()})
        out.update({f"backward g.params[{n}]": v for n, v in g.params.items()})
        out.update({f"backward g.states[{n}]": v for n, v in g.states.items()})
    return out


def relative_error(got: Any, want: np.ndarray) -> float:
    """``max|got - want| / max(1, max|want|)``; inf for a wrong shape or a non-finite value."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return np.inf
    if want.size == 0:
        return 0.0
    diff = np.abs(got.astype(np.float64) - want)
    if not np.isfinite(diff).all():
        return np.inf
    return float(diff.max() / max(1.0, float(np.abs(want).max())))


@dataclass(frozen=True)
class Mismatch:
    """One compared array over tolerance (or an exception) for one target and combination."""

    target: str
    dtype: str
    masked: bool
    quantity: str
    error: float
    tolerance: float

    @property
    def pipeline(self) -> str:
        return self.quantity.split(" ", 1)[0]

    def describe(self) -> str:
        lengths = "with lengths" if self.masked else "full length"
        return (f"{self.target} {self.dtype} {lengths}: {self.quantity}: max error "
                f"{self.error:.3g} (tolerance {self.tolerance:g})")


@dataclass
class Expected:
    """The oracle's arrays for one cell, data and lengths choice, and the run's tie margins
    (by bundled cell, see :func:`tests.fuzz.reference.group`)."""

    arrays: dict[str, np.ndarray]
    margins: dict[str, float]
    problems: list[Mismatch]

    @staticmethod
    def group_of(quantity: str) -> str:
        """The bundled cell ``quantity`` (``forward y[c2_y0]``) belongs to (see ``group``)."""
        return group(quantity[quantity.index("[") + 1:-1] if "[" in quantity else "")

    def near_tie(self, quantity: str) -> bool:
        """Whether the cell of ``quantity`` came within MARGIN of a where/relu switch."""
        return self.margins.get(self.group_of(quantity), np.inf) < MARGIN


def expected(cell: rnnc.Cell, spec: CellSpec | None, data: Data, masked: bool,
             precision: str = "fp32") -> Expected:
    """The oracle on ``data`` in float64 (float32 for bfloat16 GEMMs), checked against the
    reference evaluation of ``spec`` when given (which also gives the tie margin)."""
    try:
        arrays = run_pipelines(oracle(cell, precision), data,
                               "float32" if precision == "bf16" else "float64", masked)
    except Exception as err:  # the oracle itself failing is a finding too
        return Expected({}, {}, [Mismatch("oracle", "float64", masked,
                                          f"raised {type(err).__name__}: {err}", np.inf, 0.0)])
    if spec is None:
        return Expected(arrays, {}, [])
    ys, states, margins = evaluate(spec, data.xs, data.params, data.states,
                                  data.lengths if masked else None)
    if precision == "bf16":  # the reference knows no bfloat16: its tie margins only
        return Expected(arrays, margins, [])
    problems = []
    reference = {**{f"inference y[{n}]": v for n, v in ys.items()},
                 **{f"inference state[{n}]": v for n, v in states.items()}}
    for name, want in reference.items():
        err = relative_error(arrays[name], want)
        if not err <= TOLERANCE["float64"]:
            problems.append(Mismatch("oracle", "float64", masked, f"{name} vs reference", err,
                                     TOLERANCE["float64"]))
    return Expected(arrays, margins, problems)


@dataclass
class Stats:
    """What a run compared: cells, runs (a compiled cell or bundle in one combination), arrays
    compared, cells run in float32 and those of them whose arrays were not compared for a near
    tie (both counted once per run), the worst error by dtype."""

    cells: int = 0
    comparisons: int = 0
    float32_cells: int = 0
    skipped_float32: int = 0
    runs: int = 0
    worst: dict[str, float] = field(default_factory=lambda: {"float32": 0.0, "float64": 0.0})


def compare(target: Target, fn: Any, data: Data, want: Expected, dtype: str, masked: bool,
            stats: Stats, pipelines: tuple[str, ...] = PIPELINES) -> list[Mismatch]:
    """Run ``fn`` in one combination and compare every array with the oracle's."""
    stats.runs += 1
    tolerance = TOLERANCE["bf16" if getattr(fn, "precision", "fp32") == "bf16" else dtype]
    try:
        got = run_pipelines(fn, data, dtype, masked, pipelines)
    except Exception as err:
        return [Mismatch(target.name, dtype, masked, f"raised {type(err).__name__}: {err}",
                         np.inf, tolerance)]
    ran = set(pipelines) | ({"forward"} if "backward" in pipelines else set())
    names = [n for n in want.arrays if n.split(" ", 1)[0] in ran]
    found = [Mismatch(target.name, dtype, masked, f"{name} has no counterpart in the oracle",
                      np.inf, tolerance) for name in got if name not in want.arrays]
    tied: set[str] = set()
    for name in names:
        if dtype == "float32" and want.near_tie(name):
            tied.add(want.group_of(name))
            continue
        err = relative_error(got[name], want.arrays[name]) if name in got else np.inf
        stats.comparisons += 1
        stats.worst[dtype] = max(stats.worst[dtype], err)
        if not err <= tolerance:
            found.append(Mismatch(target.name, dtype, masked, name, err, tolerance))
    if dtype == "float32":
        stats.float32_cells += len({want.group_of(n) for n in names})
        stats.skipped_float32 += len(tied)
    return found


def check_cell(cell: rnnc.Cell, T: int, B: int, seed: int, target: Target,
               combos: tuple[tuple[str, bool], ...] = COMBOS, stats: Stats | None = None,
               pipelines: tuple[str, ...] = PIPELINES, spec: CellSpec | None = None
               ) -> list[Mismatch]:
    """Compile ``cell`` once for ``target`` and compare each combination with the oracle
    (which is checked against the reference evaluation of ``spec`` when given); the seed's
    :func:`drawn_precision` "bf16" compiles both with bfloat16 GEMMs and runs float32 only."""
    stats = stats if stats is not None else Stats()
    data = make_data(cell, T, B, seed)
    precision = drawn_precision(seed)
    if precision == "bf16":
        combos = tuple(dict.fromkeys(("float32", m) for _, m in combos))
    wants = {m: expected(cell, spec, data, m, precision) for m in sorted({m for _, m in combos})}
    problems = [p for w in wants.values() for p in w.problems]
    if problems:
        return problems
    try:
        fn = target.compile(cell, precision=precision)
    except Exception as err:
        return [Mismatch(target.name, "-", False, f"compile raised {type(err).__name__}: {err}",
                         np.inf, 0.0)]
    found = []
    for dtype, masked in combos:
        found += compare(target, fn, data, wants[masked], dtype, masked, stats, pipelines)
    return found


def check(spec: CellSpec, T: int, B: int, seed: int, target: Target,
          combos: tuple[tuple[str, bool], ...] = COMBOS, stats: Stats | None = None,
          pipelines: tuple[str, ...] = PIPELINES) -> list[Mismatch]:
    """:func:`check_cell` on the cell of ``spec``."""
    return check_cell(build(spec), T, B, seed, target, combos, stats, pipelines, spec)


def replay(cell: rnnc.Cell, target: str, T: int, B: int, seed: int, dtype: str,
           masked: bool) -> list[Mismatch]:
    """Rerun one combination of a printed reproducer; print and return its mismatches."""
    found = check_cell(cell, T, B, seed, TARGETS[target], ((dtype, masked),))
    for m in found:
        print(m.describe())
    return found
