"""Translation validation: a compiled function against the oracle, on small random inputs.

``rnnc.compile(cell, ..., check=True)`` (or ``RNNC_CHECK=1``) calls :func:`check_function`. It
runs the compiled function in float64 and float32, inference and training (forward, then
backward with random cotangents), without and with variable lengths, and compares outputs,
final states and every gradient with the oracle run in the same dtype: the traced program
interpreted by NumPy with no optimization (``rnnc.compile(cell, optimize=False)``).
``check="second-order"`` (or ``RNNC_CHECK=second-order``) also compares the double backward
(``Function.double_backward`` with random cotangents of every gradient).

When they disagree, the pipelines are replayed pass by pass in the NumPy interpreter, in that
dtype, and the error names the first pass whose output disagrees with the oracle; when every
optimized program agrees, the error names the backend's code generation instead.

Float32 is compared with float32, since a cell may legitimately round differently from float64
(a rounding trick such as ``(x + 2**23) - 2**23``, a cancellation). The float32 oracle is also
compared with the float64 one: where they differ by more than float32's tolerance, the cell is
sensitive to float32 rounding, and the check says so in a :class:`rnnc.CheckWarning`. There, a
float32 run that disagrees with both oracles cannot be told from rounding (reassociation moves
it): it is reported in that warning too, not as a fault, since the same code in float64 agreed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rnnc import passes
from rnnc.errors import CheckError, CheckWarning

T, B = 4, 3
LENGTHS = np.array([4, 1, 3])
SEED = 0  # the masks of a cell that draws them (rnnc.bernoulli); other cells ignore it
SECOND_ORDER = "second-order"  # the mode of a check that runs double backward
# The modes double_backward runs, in the order the tape and the saved values flow.
SECOND_ORDER_MODES = ("forward", "forward.forward", "forward.backward", "backward.forward",
                      "backward.backward")
# Error allowed relative to the reference's largest magnitude (plus one): float32 rounding
# over a few steps stays far below 1e-3; a miscompilation (a dropped term) is far above it.
TOLERANCE = {"f64": 1e-9, "f32": 1e-3}
NP = {"f64": np.float64, "f32": np.float32}


class _Data:
    """Inputs, parameters, initial states and cotangents for one check (float64 masters)."""

    def __init__(self, fn: Any) -> None:
        rng = np.random.default_rng(0)
        cell = fn.cell
        self.x = {n: rng.standard_normal((T, B, s[-1])) for n, s in fn.inputs.items()}
        self.params = cell.init_params(seed=0, dtype=np.float64)
        self.states = {n: rng.uniform(-0.5, 0.5, (B, s[-1])) for n, s in fn.states.items()}
        self.d_outputs = {n: rng.standard_normal((T, B, cell.graph.node(o).shape[-1]))
                          for n, o in cell.outputs.items()}
        self.d_states = {n: rng.standard_normal((B, s[-1])) for n, s in fn.states.items()}
        # Cotangents of the gradients, for the double backward.
        self.g_x = {n: rng.standard_normal((T, B, s[-1])) for n, s in fn.inputs.items()
                    if n not in fn.no_grad}
        self.g_params = {n: rng.standard_normal(v.shape) for n, v in self.params.items()}
        self.g_states = {n: rng.standard_normal((B, s[-1])) for n, s in fn.states.items()}

    def cast(self, dtype: str) -> dict[str, Any]:
        def conv(d: dict) -> dict:
            return {k: v.astype(NP[dtype]) for k, v in d.items()}

        x = conv(self.x)
        return {"x": x if len(x) > 1 else next(iter(x.values())), "params": conv(self.params),
                "states": conv(self.states), "d_outputs": conv(self.d_outputs),
                "d_states": conv(self.d_states), "g_x": conv(self.g_x),
                "g_params": conv(self.g_params), "g_states": conv(self.g_states)}


def _run(fn: Any, data: dict[str, Any], mode: str, lengths: np.ndarray | None
         ) -> dict[str, np.ndarray]:
    """Everything ``fn`` computes for ``mode`` ("inference", "training" or "second-order"),
    flat by name."""
    if mode == "inference":
        ys, st = fn(data["x"], data["params"], states=data["states"], lengths=lengths,
                    seed=SEED)
        return {**{f"output {k}": v for k, v in ys.items()},
                **{f"final state {k}": v for k, v in st.items()}}
    ys, st, tape = fn.forward(data["x"], data["params"], states=data["states"], lengths=lengths,
                              seed=SEED)
    out = {**{f"output {k}": v for k, v in ys.items()},
           **{f"final state {k}": v for k, v in st.items()}}
    if mode == SECOND_ORDER:
        dd_out, dd_st, g = fn.double_backward(tape, data["d_outputs"], data["d_states"],
                                              data["g_x"], data["g_params"], data["g_states"])
        out.update({f"double backward's cotangent of d_outputs[{k!r}]": v
                    for k, v in dd_out.items()})
        out.update({f"double backward's cotangent of d_states[{k!r}]": v
                    for k, v in dd_st.items()})
        return out | _grads(fn, g, "double backward's cotangent of")
    g = fn.backward(tape, d_outputs=data["d_outputs"], d_states=data["d_states"])
    return out | _grads(fn, g, "gradient of")


def _grads(fn: Any, g: Any, what: str) -> dict[str, np.ndarray]:
    """The arrays of ``Grads`` ``g`` by name, each named ``what`` it is of."""
    gx = g.x if isinstance(g.x, dict) else {} if g.x is None else \
        {next(iter(fn.inputs)): g.x}  # None: the one input is declared grad=False
    out = {f"{what} input {k}": v for k, v in gx.items()}
    out.update({f"{what} parameter {k}": v for k, v in g.params.items()})
    out.update({f"{what} initial state {k}": v for k, v in g.states.items()})
    return out


def _first_difference(got: dict[str, np.ndarray], want: dict[str, np.ndarray], dtype: str
                      ) -> tuple[str, float, float] | None:
    """(name, error, allowed) of the first value outside tolerance, or None."""
    for name, ref in want.items():
        value, ref = np.asarray(got[name], np.float64), np.asarray(ref, np.float64)
        if value.shape != ref.shape:
            return name, float("inf"), 0.0
        nan = np.isnan(ref)
        if not np.array_equal(nan, np.isnan(value)):
            return name, float("nan"), 0.0
        finite = ~nan & np.isfinite(ref)
        allowed = TOLERANCE[dtype] * (1.0 + (float(np.abs(ref[finite]).max()) if finite.any()
                                             else 0.0))
        error = float(np.abs(value[finite] - ref[finite]).max()) if finite.any() else 0.0
        if not error <= allowed or not np.array_equal(value[~finite], ref[~finite]):
            return name, error, allowed
    return None


def _prefix_function(fn: Any, table: Callable[[str, bool], tuple[str, ...]]) -> Any:
    """A NumPy function of ``fn``'s cell running the pass lists ``table(mode, lengths)``."""
    from rnnc.api import Function

    class Prefix(Function):
        def pipeline(self, mode: str, lengths: bool) -> tuple[str, ...]:
            return table(mode, lengths)

    return Prefix(fn.cell, "numpy", check=False, reverse=fn.reverse,
                  precision=_oracle_precision(fn))


def _oracle_precision(fn: Any) -> str:
    """The oracle's precision: bfloat16 GEMMs are part of the meaning; TF32 is CUDA's own."""
    return "bf16" if getattr(fn, "precision", "fp32") == "bf16" else "fp32"


def _prepare_part(names: tuple[str, ...]) -> tuple[str, ...]:
    """The passes of ``names`` that fix the parameter layout (those before autodiff)."""
    out = []
    for name in names:
        if name.startswith("autodiff"):
            break
        if name in passes.PREPARE:
            out.append(name)
    return tuple(out)


Table = Callable[[str, bool], tuple[str, ...]]


def _replays(fn: Any, mode: str, masked: bool) -> Iterator[tuple[str, str, Table]]:
    """For each pipeline prefix to replay, in pipeline order: the pass it ends with (quoted,
    with its pipeline where several run), the mode to run and the pass lists by mode."""
    if mode in ("inference", "training"):
        first = fn.pipeline("inference" if mode == "inference" else "forward", masked)
        for k in range(1, len(first) + 1):
            cut = first[:k]
            yield repr(cut[-1]), "inference", \
                lambda m, _, cut=cut: cut if m == "inference" else _prepare_part(cut)
    if mode == "training":
        backward = fn.pipeline("backward", masked)
        for j in range(backward.index("autodiff-backward") + 1, len(backward) + 1):
            table = {"forward": first, "backward": backward[:j], "prepare": passes.PREPARE}
            yield repr(backward[j - 1]), mode, lambda m, _, table=table: table.get(m, ())
    if mode == SECOND_ORDER:
        yield from _second_order_replays(fn, masked)


def _second_order_replays(fn: Any, masked: bool) -> Iterator[tuple[str, str, Table]]:
    """The replays of double backward: the shared preparation pass by pass (every mode cut
    after its autodiff passes), then each mode's passes after autodiff, one mode at a time
    (those before it whole, those after it cut)."""
    lead = ("mask-lengths",) if masked else ()
    for j in range(1, len(passes.PREPARE) + 1):
        prep = passes.PREPARE[:j]
        table = {"prepare": prep, **{m: lead + prep + passes.ORACLE[m]
                                     for m in SECOND_ORDER_MODES}}
        yield repr(prep[-1]), SECOND_ORDER, lambda m, _, table=table: table[m]
    table = {"prepare": passes.PREPARE, **{m: lead + passes.PREPARE + passes.ORACLE[m]
                                           for m in SECOND_ORDER_MODES}}
    for mode in SECOND_ORDER_MODES:
        names = fn.pipeline(mode, masked)
        for k in range(len(table[mode]) + 1, len(names) + 1):
            table = {**table, mode: names[:k]}
            yield f"{names[k - 1]!r} (in the {mode} pipeline)", SECOND_ORDER, \
                lambda m, _, table=table: table[m]


def _culprit(fn: Any, oracle: dict[str, np.ndarray], data: dict[str, Any], mode: str,
             lengths: np.ndarray | None, dtype: str) -> str | None:
    """The first pass after which the NumPy interpreter disagrees with ``oracle`` (which ran
    in ``dtype``, on ``data`` cast to it)."""
    plain = {k: v for k, v in oracle.items() if k.startswith(("output", "final state"))}
    for culprit, run_mode, table in _replays(fn, mode, lengths is not None):
        got = _run(_prefix_function(fn, table), data, run_mode, lengths)
        if _first_difference(got, oracle if run_mode == mode else plain, dtype):
            return culprit
    return None


def check_function(fn: Any, second_order: bool = False) -> None:
    """Raise :class:`CheckError` if ``fn`` disagrees with the oracle on random inputs (with
    ``second_order``, its double backward too); warn (:class:`CheckWarning`) if the cell is
    sensitive to float32 rounding."""
    from rnnc.api import Function

    oracle_fn = Function(fn.cell, "numpy", optimize=False, reverse=fn.reverse,
                         precision=_oracle_precision(fn))
    dtypes = ("f32",) if _oracle_precision(fn) == "bf16" else ("f64", "f32")  # bf16: float32
    data = _Data(fn)
    sensitive: dict[str, str] = {}  # the first sign of float32 rounding, of each kind
    for masked in (False, True):
        lengths = LENGTHS if masked else None
        for mode in ("inference", "training") + ((SECOND_ORDER,) if second_order else ()):
            where = f"{mode}{' with lengths' if masked else ''}"
            want = {d: _run(oracle_fn, data.cast(d), mode, lengths) for d in dtypes}
            rounding = "f64" in want and _first_difference(want["f32"], want["f64"], "f32")
            if rounding:
                sensitive.setdefault("oracle", f"{where}: the unoptimized program's "
                                     f"{rounding[0]} in float32 differs from float64 by "
                                     f"{rounding[1]:.3g}")
            for dtype in dtypes:
                got = _run(fn, data.cast(dtype), mode, lengths)
                diff = _first_difference(got, want[dtype], dtype)
                if diff is None or dtype == "f32" and "f64" in want and (
                        _first_difference(got, want["f64"], "f32") is None):
                    continue  # float32 within tolerance of float64: right, however rounded
                if dtype == "f32" and rounding:  # a different order of operations rounds
                    sensitive.setdefault("compiled", f"the compiled {diff[0]} in float32 "
                                         f"differs from the unoptimized float32 program's by "
                                         f"{diff[1]:.3g}")
                    continue
                _fail(fn, diff, f"{where}, {np.dtype(NP[dtype])}",
                      _culprit(fn, want[dtype], data.cast(dtype), mode, lengths, dtype))
    if sensitive:
        warnings.warn(f"check of cell {fn.cell.name!r}: the cell is sensitive to float32 "
                      f"rounding ({'; '.join(sensitive.values())}); the compiled code agrees "
                      f"with the oracle in float64, and in float32 as far as that rounding "
                      f"lets a comparison tell: the difference is the cell's arithmetic in "
                      f"float32, not a fault of rnnc", CheckWarning, stacklevel=4)


def _fail(fn: Any, diff: tuple[str, float, float], where: str, culprit: str | None) -> None:
    name, error, allowed = diff
    blame = (f"the first pass whose output disagrees is {culprit}" if culprit
             else f"every optimized program agrees with it, so the fault is in the "
                  f"{fn.backend.name!r} backend's code for it")
    raise CheckError(
        f"check of cell {fn.cell.name!r} failed: {where}: the {name} differs from the "
        f"unoptimized oracle by {error:.3g} (allowed {allowed:.3g}); {blame}. Please report "
        f"this with the cell's code.")
