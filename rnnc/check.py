"""Translation validation: a compiled function against the oracle, on small random inputs.

``rnnc.compile(cell, ..., check=True)`` (or ``RNNC_CHECK=1``) calls :func:`check_function`. It
runs the compiled function in float64 and float32, inference and training (forward, then
backward with random cotangents), without and with variable lengths, and compares outputs,
final states and every gradient with the oracle: the traced program interpreted by NumPy with
no optimization (``rnnc.compile(cell, optimize=False)``), in float64.

When they disagree, the pipeline is replayed pass by pass in the NumPy interpreter (float64)
and the error names the first pass whose output disagrees with the oracle; when every optimized
program agrees, the error names the backend's code generation instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc import passes
from rnnc.errors import CheckError

T, B = 4, 3
LENGTHS = np.array([4, 1, 3])
SEED = 0  # the masks of a cell that draws them (rnnc.bernoulli); other cells ignore it
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

    def cast(self, dtype: str) -> dict[str, Any]:
        def conv(d: dict) -> dict:
            return {k: v.astype(NP[dtype]) for k, v in d.items()}

        x = conv(self.x)
        return {"x": x if len(x) > 1 else next(iter(x.values())), "params": conv(self.params),
                "states": conv(self.states), "d_outputs": conv(self.d_outputs),
                "d_states": conv(self.d_states)}


def _run(fn: Any, data: dict[str, Any], mode: str, lengths: np.ndarray | None
         ) -> dict[str, np.ndarray]:
    """Everything ``fn`` computes for ``mode`` ("inference" or "training"), flat by name."""
    if mode == "inference":
        ys, st = fn(data["x"], data["params"], states=data["states"], lengths=lengths,
                    seed=SEED)
        return {**{f"output {k}": v for k, v in ys.items()},
                **{f"final state {k}": v for k, v in st.items()}}
    ys, st, tape = fn.forward(data["x"], data["params"], states=data["states"], lengths=lengths,
                              seed=SEED)
    out = {**{f"output {k}": v for k, v in ys.items()},
           **{f"final state {k}": v for k, v in st.items()}}
    g = fn.backward(tape, d_outputs=data["d_outputs"], d_states=data["d_states"])
    gx = g.x if isinstance(g.x, dict) else {} if g.x is None else \
        {next(iter(fn.inputs)): g.x}  # None: the one input is declared grad=False
    out.update({f"gradient of input {k}": v for k, v in gx.items()})
    out.update({f"gradient of parameter {k}": v for k, v in g.params.items()})
    out.update({f"gradient of initial state {k}": v for k, v in g.states.items()})
    return out


def _first_difference(got: dict[str, np.ndarray], want: dict[str, np.ndarray], dtype: str
                      ) -> tuple[str, float, float] | None:
    """(name, error, allowed) of the first value outside tolerance, or None."""
    for name, ref in want.items():
        value = np.asarray(got[name], np.float64)
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
        def _pipeline(self, mode: str, lengths: bool) -> tuple[str, ...]:
            return table(mode, lengths)

    return Prefix(fn.cell, "numpy", check=False, reverse=fn.reverse)


def _prepare_part(names: tuple[str, ...]) -> tuple[str, ...]:
    """The passes of ``names`` that fix the parameter layout (those before autodiff)."""
    out = []
    for name in names:
        if name.startswith("autodiff"):
            break
        if name in passes.PREPARE:
            out.append(name)
    return tuple(out)


def _culprit(fn: Any, oracle: dict[str, np.ndarray], data: dict[str, Any], mode: str,
             lengths: np.ndarray | None) -> str | None:
    """The first pass after which the NumPy interpreter disagrees with ``oracle``."""
    masked = lengths is not None
    if mode == "inference":
        names = fn._pipeline("inference", masked)
        for k in range(1, len(names) + 1):
            cut = names[:k]
            f = _prefix_function(fn, lambda m, _, cut=cut: cut if m == "inference"
                                 else _prepare_part(cut))
            if _first_difference(_run(f, data, mode, lengths), oracle, "f64"):
                return names[k - 1]
        return None
    forward = fn._pipeline("forward", masked)
    plain = {k: v for k, v in oracle.items() if not k.startswith("gradient")}
    for k in range(1, len(forward) + 1):
        cut = forward[:k]
        f = _prefix_function(fn, lambda m, _, cut=cut: cut if m == "inference"
                             else _prepare_part(cut))
        if _first_difference(_run(f, data, "inference", lengths), plain, "f64"):
            return forward[k - 1]
    backward = fn._pipeline("backward", masked)
    start = backward.index("autodiff-backward")
    for j in range(start + 1, len(backward) + 1):
        cut = backward[:j]
        table = {"forward": forward, "backward": cut, "prepare": passes.PREPARE}
        f = _prefix_function(fn, lambda m, _, table=table: table.get(m, ()))
        if _first_difference(_run(f, data, mode, lengths), oracle, "f64"):
            return backward[j - 1]
    return None


def check_function(fn: Any) -> None:
    """Raise :class:`CheckError` if ``fn`` disagrees with the oracle on random inputs."""
    from rnnc.api import Function

    oracle_fn = Function(fn.cell, "numpy", optimize=False, reverse=fn.reverse)
    data = _Data(fn)
    f64 = data.cast("f64")
    for masked in (False, True):
        lengths = LENGTHS if masked else None
        for mode in ("inference", "training"):
            want = _run(oracle_fn, f64, mode, lengths)
            for dtype in ("f64", "f32"):
                got = _run(fn, data.cast(dtype), mode, lengths)
                diff = _first_difference(got, want, dtype)
                if diff is None:
                    continue
                name, error, allowed = diff
                where = f"{mode}{' with lengths' if masked else ''}, {np.dtype(NP[dtype])}"
                culprit = _culprit(fn, want, f64, mode, lengths)
                blame = (f"the first pass whose output disagrees is {culprit!r}" if culprit
                         else f"every optimized program agrees with it, so the fault is in the "
                              f"{fn.backend.name!r} backend's code for it")
                raise CheckError(
                    f"check of cell {fn.cell.name!r} failed: {where}: the {name} differs from "
                    f"the unoptimized oracle by {error:.3g} (allowed {allowed:.3g}); {blame}. "
                    f"Please report this with the cell's code.")
