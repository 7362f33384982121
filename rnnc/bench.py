"""Time rnnc against its peers in one run: PyTorch (nn.LSTM/nn.GRU, an eager loop) and JAX.

Every row pairs rnnc with one peer on the same configuration, cell, mode, shapes, float32
data and thread count, measured one after the other in the same process; only the ratio
rnnc / peer carries from run to run on a shared, noisy machine. The first calls of each
function (compilation, tracing, oneDNN primitive creation) are a warm-up, never timed with
the others; the first call's time is kept to report compilation.

Library side of ``rnnc bench``; ``python benchmarks/run.py`` calls :func:`main` too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import rnnc

# ---------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """One benchmark shape (docs/benchmarks.md): T steps, B batch, I input, H hidden."""

    name: str
    T: int
    B: int
    I: int  # noqa: E741 - the paper's name
    H: int
    layers: int = 1
    directions: int = 1


CONFIGS = {
    "C1": Config("C1", 100, 64, 512, 512),
    "C2": Config("C2", 100, 1, 256, 256),
    "C3": Config("C3", 50, 16, 128, 128),
    "C4": Config("C4", 200, 32, 256, 256, layers=2, directions=2),
}


def tiny(config: Config) -> Config:
    """The same structure (layers, directions) at a size that runs in milliseconds."""
    return Config(f"{config.name}-tiny", 5, 2, 8, 8, config.layers, config.directions)


# ---------------------------------------------------------------- custom cells in rnnc's DSL


def ln_lstm(input_size: int, hidden_size: int) -> rnnc.Cell:
    """Layer-norm LSTM as in PyTorch's fastrnns: LN on both gate projections and on c."""
    H = hidden_size
    c = rnnc.Cell("ln_lstm")
    x = c.input("x", input_size)
    h = c.state("h", H)
    cs = c.state("c", H)
    W = c.param("W", (input_size, 4 * H))
    U = c.param("U", (H, 4 * H))
    gi, bi = c.param("g_i", (4 * H,), init=1.0), c.param("b_i", (4 * H,), init=0.0)
    gh, bh = c.param("g_h", (4 * H,), init=1.0), c.param("b_h", (4 * H,), init=0.0)
    gc, bc = c.param("g_c", (H,), init=1.0), c.param("b_c", (H,), init=0.0)
    gates = rnnc.layer_norm(x @ W, gi, bi) + rnnc.layer_norm(h @ U, gh, bh)
    i, f = rnnc.sigmoid(gates[:, 0:H]), rnnc.sigmoid(gates[:, H:2 * H])
    g, o = rnnc.tanh(gates[:, 2 * H:3 * H]), rnnc.sigmoid(gates[:, 3 * H:4 * H])
    c_new = rnnc.layer_norm(f * cs + i * g, gc, bc)
    h_new = o * rnnc.tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


# ---------------------------------------------------------------- the same cells for peers
# One step function per cell, written once against a small namespace ``m`` (PyTorch or
# jax.numpy), with the gate matrices concatenated as a careful user of either would.


def _cat(p: dict, names: list[str]) -> np.ndarray:
    return np.concatenate([p[n] for n in names], axis=-1)


def _ln(m, v, gamma, beta, eps: float = 1e-5):
    centred = v - m.mean(v)
    return centred * m.rsqrt(m.mean(centred * centred) + eps) * gamma + beta


def _lstm_peer_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_i{g}" for g in "ifgo"]), "U": _cat(p, [f"W_h{g}" for g in "ifgo"]),
            "b": _cat(p, [f"b_i{g}" for g in "ifgo"]) + _cat(p, [f"b_h{g}" for g in "ifgo"])}


def _lstm_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = x @ q["W"] + h @ q["U"] + q["b"]
    i, f = m.sigmoid(a[:, :H]), m.sigmoid(a[:, H:2 * H])
    g, o = m.tanh(a[:, 2 * H:3 * H]), m.sigmoid(a[:, 3 * H:])
    c = f * c + i * g
    h = o * m.tanh(c)
    return h, (h, c)


def _gru_peer_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_i{g}" for g in "rzn"]), "U": _cat(p, [f"W_h{g}" for g in "rzn"]),
            "bi": _cat(p, [f"b_i{g}" for g in "rzn"]), "bh": _cat(p, [f"b_h{g}" for g in "rzn"])}


def _gru_step(m, x, state, q):
    (h,) = state
    H = h.shape[-1]
    a = x @ q["W"] + q["bi"]
    b = h @ q["U"] + q["bh"]
    r = m.sigmoid(a[:, :H] + b[:, :H])
    z = m.sigmoid(a[:, H:2 * H] + b[:, H:2 * H])
    n = m.tanh(a[:, 2 * H:] + r * b[:, 2 * H:])
    h = (1 - z) * n + z * h
    return h, (h,)


def _mgu_peer_params(p: dict) -> dict:
    return {"W": _cat(p, ["W_f", "W_n"]), "U_f": p["U_f"], "U_n": p["U_n"],
            "b": _cat(p, ["b_f", "b_n"])}


def _mgu_step(m, x, state, q):
    (h,) = state
    H = h.shape[-1]
    a = x @ q["W"] + q["b"]
    f = m.sigmoid(a[:, :H] + h @ q["U_f"])
    n = m.tanh(a[:, H:] + (f * h) @ q["U_n"])
    h = (1 - f) * h + f * n
    return h, (h,)


def _peephole_peer_params(p: dict) -> dict:
    return {"W": _cat(p, [f"W_{g}" for g in "ifco"]), "U": _cat(p, [f"U_{g}" for g in "ifco"]),
            "b": _cat(p, [f"b_{g}" for g in "ifco"]),
            "p_i": p["p_i"], "p_f": p["p_f"], "p_o": p["p_o"]}


def _peephole_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = x @ q["W"] + h @ q["U"] + q["b"]
    i = m.sigmoid(a[:, :H] + c * q["p_i"])
    f = m.sigmoid(a[:, H:2 * H] + c * q["p_f"])
    c = f * c + i * m.tanh(a[:, 2 * H:3 * H])
    o = m.sigmoid(a[:, 3 * H:] + c * q["p_o"])
    h = o * m.tanh(c)
    return h, (h, c)


def _ln_lstm_step(m, x, state, q):
    h, c = state
    H = h.shape[-1]
    a = _ln(m, x @ q["W"], q["g_i"], q["b_i"]) + _ln(m, h @ q["U"], q["g_h"], q["b_h"])
    i, f = m.sigmoid(a[:, :H]), m.sigmoid(a[:, H:2 * H])
    g, o = m.tanh(a[:, 2 * H:3 * H]), m.sigmoid(a[:, 3 * H:])
    c = _ln(m, f * c + i * g, q["g_c"], q["b_c"])
    h = o * m.tanh(c)
    return h, (h, c)


@dataclass(frozen=True)
class CellSpec:
    """A benchmarked cell: rnnc factory, peer step and parameter mapping, torch module."""

    factory: Callable[[int, int], rnnc.Cell]
    step: Callable
    peer_params: Callable[[dict], dict]
    states: tuple[str, ...]
    torch_module: str | None = None  # "LSTM" or "GRU": a built-in to compare with


CELLS = {
    "lstm": CellSpec(rnnc.cells.lstm, _lstm_step, _lstm_peer_params, ("h", "c"), "LSTM"),
    "gru": CellSpec(rnnc.cells.gru, _gru_step, _gru_peer_params, ("h",), "GRU"),
    "mgu": CellSpec(rnnc.cells.mgu, _mgu_step, _mgu_peer_params, ("h",)),
    "peephole_lstm": CellSpec(rnnc.cells.peephole_lstm, _peephole_step, _peephole_peer_params,
                              ("h", "c")),
    "ln_lstm": CellSpec(ln_lstm, _ln_lstm_step, dict, ("h", "c")),
}
PEERS = ("torch", "eager", "jax")
MODES = ("inference", "training")
COLUMNS = ("config", "cell", "mode", "peer", "rnnc ms", "rnnc min-max", "peer ms",
           "peer min-max", "ratio")


def layer_params(spec: CellSpec, config: Config) -> list[list[dict[str, np.ndarray]]]:
    """rnnc parameters of every layer and direction, each from its own seed."""
    grid = []
    for layer in range(config.layers):
        size = config.I if layer == 0 else config.directions * config.H
        cell = spec.factory(size, config.H)
        grid.append([cell.init_params(seed=100 * layer + d) for d in range(config.directions)])
    return grid


# ---------------------------------------------------------------- rnnc


class RnncStack:
    """Layers and directions composed from single-layer compiled functions, one per shape."""

    def __init__(self, spec: CellSpec, config: Config, grid: list, backend: str,
                 options: dict) -> None:
        self.config = config
        self.fns = {}
        for layer in range(config.layers):
            size = config.I if layer == 0 else config.directions * config.H
            if size not in self.fns:
                self.fns[size] = rnnc.compile(spec.factory(size, config.H), backend=backend,
                                              **options)
        self.layers = []
        for layer, row in enumerate(grid):
            fn = self.fns[config.I if layer == 0 else config.directions * config.H]
            self.layers.append([(fn, fn.pack(p)) for p in row])

    def infer(self, x: np.ndarray) -> np.ndarray:
        for row in self.layers:
            ys = []
            for d, (fn, flat) in enumerate(row):
                y = fn(_time_reversed(x, d), flat)[0]["y"]
                ys.append(y if d == 0 else y[::-1])
            x = ys[0] if len(ys) == 1 else np.concatenate(ys, axis=-1)
        return x

    def train(self, x: np.ndarray) -> tuple[np.ndarray, list]:
        """Forward with tapes, then backward of sum(y); return (y, gradients)."""
        tapes, grads = [], []
        for row in self.layers:
            ys, row_tapes = [], []
            for d, (fn, flat) in enumerate(row):
                y, _, tape = fn.forward(_time_reversed(x, d), flat)
                ys.append(y["y"] if d == 0 else y["y"][::-1])
                row_tapes.append(tape)
            tapes.append(row_tapes)
            x = ys[0] if len(ys) == 1 else np.concatenate(ys, axis=-1)
        out = x
        dy = np.ones_like(out)
        H = self.config.H
        for row, row_tapes in zip(reversed(self.layers), reversed(tapes), strict=True):
            dx = None
            for d, ((fn, _), tape) in enumerate(zip(row, row_tapes, strict=True)):
                g = fn.backward(tape, d_outputs={"y": _time_reversed(dy[..., d * H:(d + 1) * H],
                                                                      d)})
                grads.append(g.flat)
                gx = g.x if d == 0 else g.x[::-1]
                dx = gx.copy() if dx is None else dx + gx
            dy = dx
        return out, grads


def _time_reversed(x: np.ndarray, direction: int) -> np.ndarray:
    return np.ascontiguousarray(x if direction == 0 else x[::-1])


def rnnc_call(spec: CellSpec, config: Config, grid: list, mode: str, backend: str,
              options: dict, use_layers_api: bool) -> tuple[Callable[[np.ndarray], Any], str]:
    """A callable ``x -> y`` timing rnnc, and how it was composed."""
    stacked = config.layers > 1 or config.directions > 1
    if stacked and use_layers_api and hasattr(rnnc, "RNN"):
        name = next((k for k, v in CELLS.items() if v is spec), "")
        kind = name if spec.torch_module else spec.factory
        layer = rnnc.RNN(kind, config.I, config.H, num_layers=config.layers,
                         bidirectional=config.directions == 2, backend=backend, **options)
        if mode == "inference":
            return (lambda x: layer.forward(x, params=grid, train=False)[0]), "rnnc.RNN"

        def train(x: np.ndarray) -> np.ndarray:
            y, _, tape = layer.forward(x, params=grid)
            layer.backward(tape, d_y=np.ones_like(y))
            return y
        return train, "rnnc.RNN"
    stack = RnncStack(spec, config, grid, backend, options)
    if mode == "inference":
        return stack.infer, "composed" if stacked else "compiled"
    return (lambda x: stack.train(x)[0]), "composed" if stacked else "compiled"


# ---------------------------------------------------------------- PyTorch peers


class _TorchMath:
    def __init__(self, torch) -> None:
        self.sigmoid, self.tanh, self.rsqrt = torch.sigmoid, torch.tanh, torch.rsqrt

    @staticmethod
    def mean(v):
        return v.mean(-1, keepdim=True)


def torch_builtin_call(spec: CellSpec, config: Config, grid: list, mode: str):
    """nn.LSTM / nn.GRU holding the same weights as rnnc (PyTorch's gate order and layout)."""
    import torch

    gates = {"LSTM": "ifgo", "GRU": "rzn"}[spec.torch_module]
    module = getattr(torch.nn, spec.torch_module)(
        config.I, config.H, num_layers=config.layers, bidirectional=config.directions == 2)
    with torch.no_grad():
        for layer, row in enumerate(grid):
            for d, p in enumerate(row):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                for kind, src in (("weight_ih", "W_i"), ("weight_hh", "W_h"),
                                  ("bias_ih", "b_i"), ("bias_hh", "b_h")):
                    value = _cat(p, [f"{src}{g}" for g in gates])
                    getattr(module, kind + sfx).copy_(torch.from_numpy(value.T.copy()))
    if mode == "inference":
        def infer(x):
            with torch.no_grad():
                return module(x)[0]
        return infer, f"nn.{spec.torch_module}"

    def train(x):
        module.zero_grad(set_to_none=True)
        x = x.detach().requires_grad_(True)
        y = module(x)[0]
        y.sum().backward()
        return y
    return train, f"nn.{spec.torch_module}"


def torch_eager_call(spec: CellSpec, config: Config, grid: list, mode: str):
    """A Python loop over time of the same cell, one small PyTorch op at a time."""
    import torch

    m = _TorchMath(torch)
    weights = [[{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
                 spec.peer_params(p).items()} for p in row] for row in grid]
    leaves = [w for row in weights for q in row for w in q.values()]

    def forward(x):
        T, B = x.shape[0], x.shape[1]
        for row in weights:
            outs = []
            for d, q in enumerate(row):
                state = tuple(x.new_zeros(B, config.H) for _ in spec.states)
                ys = [None] * T
                for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                    ys[t], state = spec.step(m, x[t], state, q)
                outs.append(torch.stack(ys))
            x = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        return x

    if mode == "inference":
        def infer(x):
            with torch.no_grad():
                return forward(x)
        return infer, "eager loop"

    def train(x):
        for w in leaves:
            w.grad = None
            w.requires_grad_(True)
        x = x.detach().requires_grad_(True)
        y = forward(x)
        y.sum().backward()
        return y
    return train, "eager loop"


# ---------------------------------------------------------------- JAX peer


def jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def jax_call(spec: CellSpec, config: Config, grid: list, mode: str):
    """jax.lax.scan of the same cell under jax.jit; training is jax.grad of sum(y), jitted."""
    import jax
    import jax.numpy as jnp

    class m:
        sigmoid, tanh, rsqrt = jax.nn.sigmoid, jnp.tanh, jax.lax.rsqrt

        @staticmethod
        def mean(v):
            return jnp.mean(v, -1, keepdims=True)

    weights = [[{k: jnp.asarray(v) for k, v in spec.peer_params(p).items()} for p in row]
               for row in grid]

    def forward(weights, x):
        B = x.shape[1]
        for row in weights:
            outs = []
            for d, q in enumerate(row):
                def body(state, xt, q=q):
                    y, state = spec.step(m, xt, state, q)
                    return state, y
                init = tuple(jnp.zeros((B, config.H), x.dtype) for _ in spec.states)
                outs.append(jax.lax.scan(body, init, x, reverse=d == 1)[1])
            x = outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)
        return x

    if mode == "inference":
        fwd = jax.jit(forward)
        return (lambda x: fwd(weights, x).block_until_ready()), "lax.scan+jit"

    def loss(weights, x):
        y = forward(weights, x)
        return jnp.sum(y), y

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))

    def train(x):
        g, y = grad(weights, x)
        jax.block_until_ready(g)
        return y
    return train, "lax.scan+jit"


def _as_numpy(y: Any) -> np.ndarray:
    if hasattr(y, "detach"):
        y = y.detach().numpy()
    return np.asarray(y)


# ---------------------------------------------------------------- timing


@dataclass
class Timing:
    """Seconds of the first call (compilation included) and of the timed repetitions."""

    first: float
    times: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.times)

    @property
    def min_ms(self) -> float:
        return 1e3 * min(self.times)

    @property
    def max_ms(self) -> float:
        return 1e3 * max(self.times)


def _settle(call: Callable[[], Any], least: int, most: int = 30) -> None:
    """Call at least ``least`` times, then until a call is within 1.5x of the fastest seen.

    nn.LSTM's first few calls on a new shape can take hundreds of times longer than the rest
    (oneDNN builds its primitives); a fixed warm-up count would time those.
    """
    best = math.inf
    for n in range(most):
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        if n >= max(least - 1, 1) and elapsed <= 1.5 * best:
            return
        best = min(best, elapsed)


def timed(calls: dict[str, Callable[[], Any]], reps: int, warmup: int
          ) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Time each call ``reps`` times in a block, right after its ``warmup`` untimed calls.

    Blocks, not round-robin: OpenMP (PyTorch) and OpenBLAS threads spin for a while after
    their work, and alternating libraries call by call makes each pay for the other's
    spinning threads on a small machine. Returns the timings and each call's first result
    (for checking the answers agree).
    """
    timings, firsts = {}, {}
    for name, call in calls.items():
        start = time.perf_counter()
        firsts[name] = call()
        timings[name] = Timing(time.perf_counter() - start)
        _settle(call, warmup - 1)
        for _ in range(reps):
            start = time.perf_counter()
            call()
            timings[name].times.append(time.perf_counter() - start)
    return timings, firsts


def bench_one(config: Config, cell: str, mode: str, peers: list[str], args: argparse.Namespace,
              options: dict) -> list[dict[str, Any]]:
    """Rows of one configuration, cell and mode: rnnc against every applicable peer."""
    spec = CELLS[cell]
    grid = layer_params(spec, config)
    x = np.random.default_rng(7).standard_normal((config.T, config.B, config.I)).astype(
        np.float32)
    run_rnnc, how = rnnc_call(spec, config, grid, mode, args.backend, options,
                              not args.no_layers_api)
    calls: dict[str, Callable[[], Any]] = {"rnnc": lambda: run_rnnc(x)}
    labels = {"rnnc": how}
    for peer in peers:
        if peer == "torch" and spec.torch_module is None:
            continue
        if peer == "jax":
            import jax.numpy as jnp

            fn, labels[peer] = jax_call(spec, config, grid, mode)
            xj = jnp.asarray(x)
            calls[peer] = lambda fn=fn, xj=xj: fn(xj)
        else:
            import torch

            build = torch_builtin_call if peer == "torch" else torch_eager_call
            fn, labels[peer] = build(spec, config, grid, mode)
            xt = torch.from_numpy(x)
            calls[peer] = lambda fn=fn, xt=xt: fn(xt)
    timings, firsts = timed(calls, args.reps, args.warmup)
    ours = timings["rnnc"]
    y = _as_numpy(firsts["rnnc"])
    rows = []
    for peer in calls:
        if peer == "rnnc":
            continue
        theirs = timings[peer]
        diff = float(np.max(np.abs(y - _as_numpy(firsts[peer]))))
        rows.append({
            "config": config.name, "cell": cell, "mode": mode, "peer": peer,
            "peer_impl": labels[peer], "rnnc_impl": labels["rnnc"],
            "rnnc_ms": ours.median_ms, "rnnc_min_ms": ours.min_ms, "rnnc_max_ms": ours.max_ms,
            "peer_ms": theirs.median_ms, "peer_min_ms": theirs.min_ms,
            "peer_max_ms": theirs.max_ms, "ratio": ours.median_ms / theirs.median_ms,
            "rnnc_first_ms": 1e3 * ours.first, "peer_first_ms": 1e3 * theirs.first,
            "max_abs_diff": diff, "reps": len(ours.times),
        })
    return rows


# ---------------------------------------------------------------- compile time

_COMPILE_SCRIPT = r"""
import json, sys, time
import numpy as np
import rnnc
backend, options, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
x = np.random.default_rng(0).standard_normal((2, 1, size)).astype(np.float32)

def compile_and_run():
    cell = rnnc.cells.lstm(size, size)
    params = cell.init_params()
    start = time.perf_counter()
    fn = rnnc.compile(cell, backend=backend, **options)
    ys, _, tape = fn.forward(x, params)
    fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
    first = time.perf_counter() - start
    start = time.perf_counter()
    ys, _, tape = fn.forward(x, params)
    fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
    # What remains after taking away one warm run is compilation.
    return first - (time.perf_counter() - start)

print(json.dumps([compile_and_run(), compile_and_run()]))
"""


def compile_times(backend: str, options: dict, size: int) -> dict[str, float]:
    """Seconds to compile LSTM forward + backward: cold, cached in memory, cached on disk.

    Each measurement runs in a fresh process (imports excluded) whose home and cache
    directories point at a new temporary folder, so the first is cold; a second function
    in the same process hits the in-memory cache; a second process hits the disk cache.
    """
    with tempfile.TemporaryDirectory(prefix="rnnc-bench-") as tmp:
        env = dict(os.environ, HOME=tmp, XDG_CACHE_HOME=tmp, RNNC_CACHE_DIR=tmp)
        argv = [sys.executable, "-c", _COMPILE_SCRIPT, backend, json.dumps(options), str(size)]
        results = []
        for _ in range(2):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"compile-time measurement failed:\n{done.stderr[-2000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"cold_s": results[0][0], "memory_cached_s": results[0][1],
            "disk_cached_s": results[1][0]}


# ---------------------------------------------------------------- reporting


def _fmt(ms: float) -> str:
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The rows as strings under :data:`COLUMNS`."""
    return [(r["config"], r["cell"], r["mode"], r["peer"], _fmt(r["rnnc_ms"]),
             f"{_fmt(r['rnnc_min_ms'])}-{_fmt(r['rnnc_max_ms'])}", _fmt(r["peer_ms"]),
             f"{_fmt(r['peer_min_ms'])}-{_fmt(r['peer_max_ms'])}", f"{r['ratio']:.2f}")
            for r in rows]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table."""
    body = table_rows(rows)
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) if i >= 4 else v.ljust(w)
                        for i, (v, w) in enumerate(zip(b, widths, strict=True))) for b in body]
    return "\n".join(lines)


def machine_info(threads: int, backend: str) -> dict[str, str]:
    """CPU, cores, thread count, library versions and the BLAS each side uses."""
    info = {"CPU": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         None)
        info["CPU"] = model or info["CPU"]
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["cores available"] = str(cores)
    info["threads"] = str(threads)
    info["python"] = platform.python_version()
    for dist in ("rnnc", "numpy", "torch", "llvmlite", "jax", "jaxlib", "scipy-openblas32",
                 "mkl"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    info["rnnc backend"] = backend
    info["rnnc BLAS"] = _rnnc_blas(backend)
    try:
        import torch

        settings = [p.strip() for p in torch.__config__.show().replace("\n", ",").split(",")]
        info["torch BLAS"] = ", ".join(s for s in settings if s.startswith(("BLAS_INFO",
                                                                          "USE_MKLDNN")))
    except ImportError:
        pass
    return info


def _rnnc_blas(backend: str) -> str:
    if backend == "numpy":
        try:
            import numpy.__config__ as config

            blas = config.CONFIG["Build Dependencies"]["blas"]
            return f"NumPy's {blas['name']} {blas.get('version', '')}".strip()
        except (AttributeError, KeyError, TypeError):
            return "NumPy's"
    try:
        from rnnc.backends.llvm import blas

        names = [b.name for b in blas.same_convention(blas.get())]
        return ", ".join(names) + (" (chosen per GEMM shape)" if len(names) > 1 else "")
    except Exception as err:  # noqa: BLE001 - informational only
        return f"unknown ({err})"


def to_markdown(rows: list[dict[str, Any]], info: dict[str, str], command: str,
                compile_s: dict[str, float] | None) -> str:
    """The table as Markdown, preceded by the machine and followed by compile times."""
    out = ["# rnnc benchmark", "", f"Command: `{command}`", ""]
    out += [f"- {k}: {v}" for k, v in info.items()]
    cols = COLUMNS + ("max abs diff", "rnnc 1st call ms", "peer impl")
    out += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r, cells in zip(rows, table_rows(rows), strict=True):
        extra = (f"{r['max_abs_diff']:.1e}", _fmt(r["rnnc_first_ms"]),
                 f"{r['peer_impl']} vs {r['rnnc_impl']}")
        out.append("| " + " | ".join(cells + extra) + " |")
    out += ["", "ms are medians of the timed repetitions (min-max alongside); ratio is "
            "rnnc / peer, lower is better. The first call of each function is excluded."]
    if compile_s:
        out += ["", "Compile time, LSTM forward + backward: "
                + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f} s"
                            for k, v in compile_s.items())]
    return "\n".join(out) + "\n"


def write_png(rows: list[dict[str, Any]], path: str) -> None:
    """A bar chart of ratios, one panel per configuration; needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--png needs matplotlib: pip install matplotlib") from None
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(len(configs), 1, figsize=(10, 3.2 * len(configs)), squeeze=False)
    for ax, name in zip(axes[:, 0], configs, strict=True):
        mine = [r for r in rows if r["config"] == name]
        labels = [f"{r['cell']}\n{r['mode'][:5]}\n{r['peer']}" for r in mine]
        ratios = [r["ratio"] for r in mine]
        colours = ["tab:green" if v <= 1 else "tab:red" for v in ratios]
        ax.bar(range(len(mine)), ratios, color=colours)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set_ylabel("rnnc / peer")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------- command line


def _names(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return list(allowed)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or value!r}; choose from "
                                         f"{', '.join(allowed)} or all")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``rnnc bench`` (and of ``benchmarks/run.py``)."""
    configs, cells = tuple(CONFIGS), tuple(CELLS)
    parser.add_argument("--configs", default="all",
                        type=lambda v: _names(v, configs, "configuration"),
                        help=f"comma-separated from {', '.join(configs)} (default all)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="tiny: the same layers and directions at T=5 B=2 I=H=8 (smoke test)")
    parser.add_argument("--cells", default="all", type=lambda v: _names(v, cells, "cell"),
                        help=f"comma-separated from {', '.join(cells)} (default all)")
    parser.add_argument("--modes", default="all", type=lambda v: _names(v, MODES, "mode"),
                        help="inference, training or all (training: forward + backward of "
                             "sum(y))")
    parser.add_argument("--peers", default=None, type=lambda v: _names(v, PEERS, "peer"),
                        help="torch (nn.LSTM/nn.GRU), eager (PyTorch loop), jax (lax.scan+jit);"
                             " default: all, jax only when it imports")
    parser.add_argument("--backend", default="llvm", help="rnnc backend (default llvm)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for rnnc's BLAS and PyTorch (default: available cores)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (>= 5 to report)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (>= 1)")
    parser.add_argument("--no-layers-api", action="store_true",
                        help="compose C4 from single-layer functions even if rnnc.RNN exists")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip measuring LSTM compile time (cold and cached)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--png", metavar="FILE", help="bar chart of ratios (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by parsed ``args``; print the table; 0 on success."""
    if args.reps < 1 or args.warmup < 1:
        print("rnnc bench: --reps and --warmup must be at least 1", file=sys.stderr)
        return 2
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("rnnc bench: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    peers = args.peers
    if peers is None:
        peers = [p for p in PEERS if p != "jax" or jax_available()]
    elif "jax" in peers and not jax_available():
        print("rnnc bench: --peers jax but jax does not import (pip install jax)",
              file=sys.stderr)
        return 2
    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count() or 1)
    options = {} if args.backend == "numpy" else {"threads": threads}
    if {"torch", "eager"} & set(peers):
        import torch

        torch.set_num_threads(threads)
    configs = [CONFIGS[c] for c in args.configs]
    if args.size == "tiny":
        configs = [tiny(c) for c in configs]
    rows = []
    for config in configs:
        for cell in args.cells:
            for mode in args.modes:
                new = bench_one(config, cell, mode, peers, args, options)
                for line in format_table(new).splitlines()[2:]:
                    print(line, flush=True)
                rows += new
    compile_s = None
    if not args.no_compile_time:
        compile_s = compile_times(args.backend, options, configs[0].H)
    print()
    print(format_table(rows))
    if compile_s:
        print("\ncompile LSTM forward+backward: " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f} s" for k, v in compile_s.items()))
    command = "rnnc bench " + " ".join(getattr(args, "argv", None) or sys.argv[1:])
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(to_markdown(rows, machine_info(threads, args.backend), command, compile_s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "compile": compile_s,
                       "machine": machine_info(threads, args.backend)}, f, indent=1)
    if args.png:
        write_png(rows, args.png)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` as ``rnnc bench`` would and run."""
    parser = argparse.ArgumentParser(prog="rnnc bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
