"""Differential target for ``rnnc.torch.RNN`` under ``torch.compile``, in-cell randomness included.

A fuzz cell (tests/fuzz/cells.py) becomes a layer with masks of its own: each state update goes
through zoneout, ``s' = m * s + (1 - m) * update`` with ``m = rnnc.bernoulli(p, like=s)`` (a new
mask every step, or one per sequence), and the first input through variational dropout,
``x0 * rnnc.bernoulli(q, like=x0, per="sequence") / q``. Its first output is the layer's ``y``;
the other inputs are the layer's extra inputs. The layer (one or two directions) runs as
``rnnc.torch.RNN`` through a function compiled with ``torch.compile(..., fullgraph=True)``, and
eagerly; the loss ``sum(y * dy) + sum(h_n * dh_n)`` is differentiated by torch with respect to
``x``, the extra inputs, the initial states and every parameter.

The oracle is the unoptimized traced program (``rnnc.compile(cell, optimize=False)``, checked
against a NumPy evaluation of the spec by the main targets) in float64, run direction by
direction with the seed that torch's generator dictates: ``torch.manual_seed(k)`` then one
``torch.randint(0, 2**62, (1,))`` is the call's seed, and direction ``d`` of layer ``k`` draws
its masks from ``SeedSequence([seed, k, d])`` (both written out here from the documented
contract, not imported). Masks are the one thing oracle and target share (Philox, checked
against Random123's known answers in tests/rnnc/test_random.py); everything around them is
independent: the optimizing pipeline, the layer glue, the custom op and its autograd rule, and
the seed's path into the forward and the backward op. Comparing against the eager module would
not be enough: both paths share the layer and its glue, and eager drew its masks the same way.
A compiled backward that drew new masks, or a seed that ``torch.manual_seed`` does not govern,
is off by O(0.1). Float64 only (float32 would need the main targets' tie margins, which the
NumPy evaluation of the spec cannot give for masks); sequences are full length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

import rnnc
import rnnc.torch as rt
from tests.fuzz.differential import TOLERANCE, Mismatch, case, relative_error
from tests.fuzz.spec import CellSpec, body_lines, prune, substitute, var

SEED_HIGH = 2**62  # rnnc.torch.RNN draws each call's seed in [0, 2**62) from torch's generator
PATHS = ("compiled", "eager")


@dataclass(frozen=True)
class RandomCase:
    """A fuzz cell with masks, and how its layer runs."""

    spec: CellSpec
    masks: tuple[tuple[str, float, str], ...]  # (name, p, per): m = rnnc.bernoulli(p, like=...)
    likes: tuple[str, ...]  # what each mask is shaped like
    T: int
    B: int
    seed: int
    bidirectional: bool


def random_case(seed: int) -> RandomCase:
    """The fuzz cell of ``seed`` with zoneout on every state and dropout on its first input."""
    base = case(seed)
    rng = np.random.default_rng([seed, 3])
    spec = replace(base.spec, outputs=(("y", base.spec.outputs[0][1]),), name="fuzz_random")
    masks, likes = [], []
    updates = []
    for name, e in spec.updates:
        m = f"zone_{name}"
        masks.append((m, float(rng.choice([0.3, 0.5, 0.7])), str(rng.choice(["step",
                                                                              "sequence"]))))
        likes.append(name)
        updates.append((name, var(m) * var(name) + (1.0 - var(m)) * e))
    spec = replace(spec, updates=tuple(updates))
    x0 = spec.inputs[0][0]
    if rng.random() < 0.7:
        q = float(rng.choice([0.5, 0.8]))
        masks.append((f"keep_{x0}", q, "sequence"))
        likes.append(x0)
        spec = substitute(spec, {x0: var(x0) * var(f"keep_{x0}") * (1.0 / q)})
    return RandomCase(spec, tuple(masks), tuple(likes), base.T, base.B, seed,
                      bool(rng.random() < 0.3))


def source(rc: RandomCase) -> str:
    """The cell factory ``make_cell(input_size, hidden_size)`` as Python (sizes are fixed)."""
    spec = prune(rc.spec)
    lines = body_lines(spec)
    at = len(spec.inputs) + len(spec.states) + len(spec.params)
    draws = [f"{m} = rnnc.bernoulli({p!r}, like={like}, per={per!r})"
             for (m, p, per), like in zip(rc.masks, rc.likes, strict=True)]
    body = "\n".join("    " + line for line in lines[:at] + draws + lines[at:])
    return (f"import rnnc\n\n\ndef make_cell(input_size, hidden_size):\n"
            f"    c = rnnc.Cell({spec.name!r})\n{body}\n    return c\n")


def factory(rc: RandomCase) -> Callable[[int, int], rnnc.Cell]:
    namespace: dict = {}
    exec(compile(source(rc), f"<fuzz random cell {rc.seed}>", "exec"), namespace)  # noqa: S102
    return namespace["make_cell"]


def direction_seed(seed: int, k: int, d: int) -> int:
    """The seed of layer ``k``'s direction ``d`` given the call's seed (rnnc.RNN's contract)."""
    words = np.random.SeedSequence([seed, k, d]).generate_state(2, np.uint32)
    return int(words[0]) | int(words[1]) << 32


def torch_seed(manual_seed: int) -> int:
    """The call seed a module draws first after ``torch.manual_seed(manual_seed)``."""
    g = torch.Generator().manual_seed(manual_seed)
    return int(torch.randint(0, SEED_HIGH, (1,), generator=g).item())


@dataclass
class Data:
    """Float64 tensors of one run: inputs, initial states, cotangents; parameters by name."""

    x: torch.Tensor
    extra: dict[str, torch.Tensor]
    h0: dict[str, torch.Tensor]
    dy: torch.Tensor
    dh: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]


def make_data(rc: RandomCase, module: rt.RNN) -> Data:
    """Data from the case's seed alone; each direction's parameters are the cell's init."""
    rng = np.random.default_rng([rc.seed, 4])
    D = 2 if rc.bidirectional else 1

    def t(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape))

    (_, w0), *extras = rc.spec.inputs
    sizes = module.layer.state_sizes
    h0 = {n: torch.from_numpy(rng.uniform(-0.5, 0.5, (D, rc.B, s))) for n, s in sizes.items()}
    width = D * module.layer.output_size
    cell = factory(rc)(w0, 0)
    params = {}
    for d in range(D):
        init = cell.init_params(seed=rc.seed + d, dtype=np.float64)
        suffix = "_l0" + ("_reverse" if d else "")
        params.update({n + suffix: torch.from_numpy(v) for n, v in init.items()})
    return Data(t(rc.T, rc.B, w0), {n: t(rc.T, rc.B, w) for n, w in extras}, h0,
                t(rc.T, rc.B, width), {n: t(D, rc.B, s) for n, s in sizes.items()}, params)


def oracle(make_cell: Callable[[int, int], rnnc.Cell], module: rt.RNN, data: Data, seed: int
           ) -> dict[str, np.ndarray]:
    """What ``module`` (one layer of ``make_cell``'s cell) must give on ``data`` when its
    call draws ``seed``: the unoptimized program of each direction in float64."""
    cell = make_cell(data.x.shape[-1], module.hidden_size)
    x0 = next(iter(cell.sizes("input")))
    xs = {x0: data.x.numpy(), **{n: e.numpy() for n, e in data.extra.items()}}
    out: dict[str, Any] = {"grad x": 0.0, **{f"grad extra[{n}]": 0.0 for n in data.extra}}
    ys, D = [], 2 if module.bidirectional else 1
    W = module.layer.output_size
    for d in range(D):
        fn = rnnc.compile(cell, backend="numpy", optimize=False, reverse=d == 1)
        suffix = "_l0" + ("_reverse" if d else "")
        params = {n[:-len(suffix)]: p.numpy() for n, p in data.params.items()
                  if n.endswith(suffix)}
        states = {n: h[d].numpy() for n, h in data.h0.items()}
        y, st, tape = fn.forward(xs, params, states, seed=direction_seed(seed, 0, d))
        ys.append(y["y"])
        for n, s in st.items():
            out.setdefault(f"state[{n}]", []).append(s)
        g = fn.backward(tape, {"y": data.dy[..., d * W:(d + 1) * W].numpy()},
                        {n: h[d].numpy() for n, h in data.dh.items()})
        gx = g.x if isinstance(g.x, dict) else {x0: g.x}
        out["grad x"] = out["grad x"] + gx[x0]
        for n in data.extra:
            out[f"grad extra[{n}]"] = out[f"grad extra[{n}]"] + gx[n]
        for n, v in g.states.items():
            out.setdefault(f"grad h0[{n}]", []).append(v)
        out.update({f"grad {n}{suffix}": v for n, v in g.params.items()})
    out["y"] = np.concatenate(ys, axis=-1)
    return {k: np.stack(v) if isinstance(v, list) else v for k, v in out.items()}


def run_module(call: Callable[..., Any], module: rt.RNN, data: Data, manual_seed: int
               ) -> dict[str, np.ndarray]:
    """The module's outputs and torch's gradients of the loss, through ``call(module, x, h0,
    extra)`` after ``torch.manual_seed(manual_seed)``."""
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(data.params[n])
    leaves = {"x": data.x, **{f"extra[{n}]": e for n, e in data.extra.items()},
              **{f"h0[{n}]": h for n, h in data.h0.items()}}
    leaves = {k: v.clone().requires_grad_() for k, v in leaves.items()}
    extra = {n: leaves[f"extra[{n}]"] for n in data.extra}
    torch.manual_seed(manual_seed)
    y, st = call(module, leaves["x"], {n: leaves[f"h0[{n}]"] for n in data.h0}, extra)
    loss = (y * data.dy).sum() + sum((st[n] * data.dh[n]).sum() for n in data.dh)
    named = list(leaves.items()) + list(module.named_parameters())
    grads = torch.autograd.grad(loss, [t for _, t in named], allow_unused=True)
    out = {"y": y, **{f"state[{n}]": s for n, s in st.items()}}
    out.update({f"grad {n}": torch.zeros_like(t) if g is None else g
                for (n, t), g in zip(named, grads, strict=True)})
    return {k: v.detach().double().numpy() for k, v in out.items()}


def _eager(module: rt.RNN, x: torch.Tensor, h0: Any, extra: Any) -> Any:
    return module(x, h0, extra=extra)


@dataclass
class Stats:
    """Cells run, arrays compared, cells whose masks changed the result, worst errors."""

    cells: int = 0
    comparisons: int = 0
    masks_mattered: int = 0
    worst: float = 0.0


def check(seed: int, backend: str = "aot_eager", stats: Stats | None = None) -> list[Mismatch]:
    """Compare the compiled and eager module on the random cell of ``seed`` with the oracle
    in float64; return the mismatches."""
    stats = stats if stats is not None else Stats()
    rc = random_case(seed)
    width = rc.spec.inputs[0][1]
    module = rt.RNN(factory(rc), width, 2, backend="numpy", bidirectional=rc.bidirectional,
                    dtype=torch.float64)
    data = make_data(rc, module)
    call_seed = torch_seed(seed)
    want = oracle(factory(rc), module, data, call_seed)
    other = oracle(factory(rc), module, data, call_seed + 1)
    stats.cells += 1
    stats.masks_mattered += any(relative_error(other[k], v) > 1e-6 for k, v in want.items())
    torch._dynamo.reset()  # a fresh cache: each cell is its own configuration
    compiled = torch.compile(_eager, backend=backend, fullgraph=True)
    found, tolerance = [], TOLERANCE["float64"]
    for path, call in zip(PATHS, (compiled, _eager), strict=True):
        target = f"rnnc.torch {path}" + (f" ({backend})" if path == "compiled" else "")
        try:
            got = run_module(call, module, data, seed)
        except Exception as err:  # noqa: BLE001 - a crash is a finding
            found.append(Mismatch(target, "float64", False,
                                  f"raised {type(err).__name__}: {err}", np.inf, 0.0))
            continue
        for key, value in want.items():
            err = relative_error(got.get(key, np.empty(0)), value)
            stats.comparisons += 1
            stats.worst = max(stats.worst, err)
            if not err <= tolerance:
                found.append(Mismatch(target, "float64", False, key, err, tolerance))
    return found


def report(seed: int, found: list[Mismatch]) -> str:
    """A failure's description and its cell's source."""
    rc = random_case(seed)
    lines = [f"fuzz seed {seed} (T={rc.T}, B={rc.B}, bidirectional={rc.bidirectional}):"]
    lines += ["  " + m.describe() for m in found[:8]]
    return "\n".join(lines) + "\n" + source(rc)
