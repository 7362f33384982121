"""``rnnc demo``: a custom cell from definition to a trained, timed, checked native function."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

import rnnc
from rnnc.cells import mgu
from rnnc.layers import fastest_backend


def numpy_loop(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    """The same cell as a plain NumPy loop: what users write today."""
    h = np.zeros((x.shape[1], p["U_f"].shape[0]), x.dtype)
    ys = []
    for x_t in x:
        f = 1 / (1 + np.exp(-(x_t @ p["W_f"] + h @ p["U_f"] + p["b_f"])))
        n = np.tanh(x_t @ p["W_n"] + (f * h) @ p["U_n"] + p["b_n"])
        h = (1 - f) * h + f * n
        ys.append(h)
    return np.stack(ys)


def _say(text: str) -> None:
    print(text, flush=True)


def _home(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


def cache_note(fn: rnnc.Function, modes: tuple[str, ...]) -> str:
    """Where the native code of ``modes`` came from: compiled now (cache cold), or a cache hit
    (warm). A compile time means little without it."""
    # The runners that the calls so far built; the LLVM backend's runners record how they got
    # their object code: "no" (compiled now), "disk" or "memory" (a cache hit).
    built = [(mode, getattr(getattr(runner, "compiled", None), "cached", None))
             for (mode, *_), runner in getattr(fn, "_runners", {}).items() if mode in modes]
    if not built or any(state is None for _, state in built):
        return "interpreted by the NumPy backend: no native code"
    root = getattr(getattr(fn.backend, "cache", None), "root", None)
    where = _home(root) if root is not None else "the disk cache"
    phrases = {"no": "cache cold: compiled to native code now"
                     + (f", saved to {where}" if root is not None else ""),
               "disk": f"cache warm: native code loaded from {where}, compiled by an earlier run",
               "memory": "cache warm: native code reused from earlier in this process"}
    if len({state for _, state in built}) == 1:
        return phrases.get(built[0][1], f"cache: {built[0][1]}")
    return "; ".join(f"{mode}: {phrases.get(state, f'cache: {state}')}" for mode, state in built)


def _timed(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def run(quick: bool = False) -> int:
    """Run the demo; 0 only if every check held."""
    I, H, T, B = (8, 16, 12, 4) if quick else (32, 64, 50, 16)
    ok = True
    cell = mgu(I, H)
    _say("== 1. a custom cell (MGU) written in rnnc's DSL; its traced IR:")
    _say(rnnc.printer.format_program(cell.program(), "mgu traced"))
    backend = fastest_backend()
    _say(f"\n== 2. compiled for the CPU (backend={backend!r}); the optimized IR:")
    rng = np.random.default_rng(0)
    params = cell.init_params(seed=0)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    start = time.perf_counter()
    fn = rnnc.compile(cell, backend=backend)
    ys, _ = fn(x, params)  # native code is built (or loaded) on the first call
    seconds = time.perf_counter() - start
    _say(fn.ir())
    _say(f"   loop ops: {fn.op_counts()['loop']}")
    _say(f"   compiled and ran in {seconds:.2f} s ({cache_note(fn, ('inference',))})")
    ref = numpy_loop(x.astype(np.float64), {k: v.astype(np.float64) for k, v in params.items()})
    err = float(np.abs(ys["y"] - ref).max())
    good = err < 1e-5
    ok &= good
    _say(f"\n== 3. check against a NumPy float64 loop: max error {err:.2e} "
         f"[{'ok' if good else 'FAILED'}]")

    _say("\n== 4. train it to recall the input from 3 steps back (loss should fall):")
    steps = 30 if quick else 60
    losses = _train(fn, cell, rng, I, H, T, B, steps)
    _say(f"   training code ({cache_note(fn, ('forward', 'backward'))})")
    good = losses[-1] < 0.7 * losses[0]
    ok &= good
    _say(f"   loss {losses[0]:.4f} -> {losses[-1]:.4f} [{'ok' if good else 'FAILED'}]")

    _say("\n== 5. speed (inference, median ms):")
    reps = 3 if quick else 7
    t_rnnc = _timed(lambda: fn(x, params), reps)
    t_np = _timed(lambda: numpy_loop(x, params), reps)
    _say(f"   {'rnnc ' + backend:<22}{t_rnnc:9.3f}")
    _say(f"   {'NumPy loop':<22}{t_np:9.3f}   rnnc/NumPy = {t_rnnc / t_np:.2f}")
    t_torch = _torch_time(x, params, reps)
    if t_torch is not None:
        _say(f"   {'PyTorch eager loop':<22}{t_torch:9.3f}   rnnc/PyTorch = {t_rnnc / t_torch:.2f}")
    _say("\nall checks held" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


def _train(fn, cell, rng, I, H, T, B, steps) -> list[float]:
    params = cell.init_params(seed=1)
    readout = (rng.standard_normal((H, 1)) / np.sqrt(H)).astype(np.float32)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    lr, losses = 0.02, []
    for step in range(1, steps + 1):
        x = rng.standard_normal((T, B, I)).astype(np.float32)
        target = np.zeros((T, B, 1), np.float32)
        target[3:] = x[:-3, :, :1]
        ys, _, tape = fn.forward(x, params)
        pred = ys["y"] @ readout
        diff = pred - target
        losses.append(float(np.mean(diff**2)))
        d_pred = 2 * diff / diff.size
        d_y = d_pred @ readout.T
        readout -= lr * np.einsum("tbh,tbo->ho", ys["y"], d_pred)
        grads = fn.backward(tape, {"y": d_y}).params
        for k in params:  # Adam
            m[k] = 0.9 * m[k] + 0.1 * grads[k]
            v[k] = 0.999 * v[k] + 0.001 * grads[k] ** 2
            mh, vh = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
            params[k] = params[k] - lr * mh / (np.sqrt(vh) + 1e-8)
        if step % 10 == 0:
            print(f"   step {step:3d}  loss {losses[-1]:.4f}", flush=True)
    return losses


def _torch_time(x: np.ndarray, params: dict[str, np.ndarray], reps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    p = {k: torch.from_numpy(v) for k, v in params.items()}
    xt = torch.from_numpy(x)

    def loop():
        with torch.no_grad():
            h = torch.zeros(x.shape[1], p["U_f"].shape[0])
            for x_t in xt:
                f = torch.sigmoid(x_t @ p["W_f"] + h @ p["U_f"] + p["b_f"])
                n = torch.tanh(x_t @ p["W_n"] + (f * h) @ p["U_n"] + p["b_n"])
                h = (1 - f) * h + f * n

    return _timed(loop, reps)


if __name__ == "__main__":
    sys.exit(run())
