"""Time ``rnnc.RNN`` against ``nn.LSTM`` at C2/C3 in CPU time, and rnnc's Python time per call.

``rnnc bench`` reports wall-clock medians; on a loaded machine those swing by several times
between runs. At one thread a call's CPU time (``time.process_time``) counts only the
cycles the call itself got, so its medians move far less. Both sides run ``rnnc bench``'s
own calls (same weights, same input) in alternating blocks; the script prints each side's
wall and CPU medians and the ratios rnnc / nn.LSTM (lower is better).
``--python-only`` instead times rnnc's call with every native run replaced by its first
result: the checks, parameter packing, allocation and dispatch per call, in microseconds.

    RNNC_THREADS=1 python benchmarks/small_sizes.py --configs C2,C3 --modes inference,training
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="C2,C3", help="configurations (default C2,C3)")
    parser.add_argument("--modes", default="inference,training",
                        help="inference, training or both (default both)")
    parser.add_argument("--reps", type=int, default=40, help="calls per timed block (40)")
    parser.add_argument("--rounds", type=int, default=6, help="blocks per side (6)")
    parser.add_argument("--python-only", action="store_true",
                        help="time rnnc's Python per call, the native runs replaced")
    return parser.parse_args(argv)


def _stub_native_runs() -> None:
    """Every LLVM runner returns its first result for a (T, B) again, without running."""
    from rnnc.backends.llvm import runtime

    original, memo = runtime.Runner.__call__, {}

    def replay(self, env, dims):
        key = (id(self), dims["T"], dims["B"])
        if key not in memo:
            memo[key] = original(self, env, dims)
        return memo[key]
    runtime.Runner.__call__ = replay


def _calls(config_name: str, mode: str, python_only: bool) -> dict:
    import numpy as np
    import torch

    from rnnc.tools.bench.configs import CELLS, CONFIGS, layer_params
    from rnnc.tools.bench.harness import rnnc_call
    from rnnc.tools.bench.peers import torch_builtin_call

    config, spec = CONFIGS[config_name], CELLS["lstm"]
    grid = layer_params(spec, config)
    x = np.random.default_rng(7).standard_normal((config.T, config.B, config.I)).astype(
        np.float32)
    run_rnnc, _ = rnnc_call(spec, config, grid, mode, "llvm", {})
    calls = {"rnnc": lambda: run_rnnc(x)}
    if not python_only:
        run_torch, _ = torch_builtin_call(spec, config, grid, mode)
        xt = torch.from_numpy(x)
        calls["nn.LSTM"] = lambda: run_torch(xt)
    return calls


def main(argv: list[str] | None = None) -> int:
    """Print the medians of each configuration and mode."""
    args = _parse(argv)
    os.environ.setdefault("RNNC_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    if args.python_only:
        _stub_native_runs()
    for config_name in args.configs.split(","):
        for mode in args.modes.split(","):
            calls = _calls(config_name, mode, args.python_only)
            wall: dict[str, list[float]] = {name: [] for name in calls}
            cpu: dict[str, list[float]] = {name: [] for name in calls}
            for call in calls.values():  # compile, build oneDNN primitives, settle
                for _ in range(10):
                    call()
            for _ in range(args.rounds):
                for name, call in calls.items():
                    for _ in range(args.reps):
                        w, c = time.perf_counter(), time.process_time()
                        call()
                        cpu[name].append(time.process_time() - c)
                        wall[name].append(time.perf_counter() - w)
            if args.python_only:
                print(f"{config_name} {mode}: rnnc's Python per call, median "
                      f"{1e6 * statistics.median(wall['rnnc']):.0f} us")
                continue
            med = {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in calls}
            print(f"{config_name} {mode}: rnnc {1e3 * med['rnnc'][0]:.2f} ms wall, "
                  f"{1e3 * med['rnnc'][1]:.2f} ms CPU; nn.LSTM {1e3 * med['nn.LSTM'][0]:.2f} "
                  f"ms wall, {1e3 * med['nn.LSTM'][1]:.2f} ms CPU; ratio wall "
                  f"{med['rnnc'][0] / med['nn.LSTM'][0]:.2f}, CPU "
                  f"{med['rnnc'][1] / med['nn.LSTM'][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
