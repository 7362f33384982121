"""``rnnc bench --scaling``: time versus threads for rnnc and PyTorch's built-in layer.

For each thread count 1, 2, 4, ... up to the usable cores (and the core count itself when it is
not a power of two), every selected configuration, cell and mode is timed for rnnc and for
``nn.LSTM``/``nn.GRU`` in the same process, one thread count after the other. The table gives
each side's median, its speed-up over its own one-thread time, and the ratio rnnc / PyTorch at
that thread count. Cells without a PyTorch built-in are compared with the eager PyTorch loop.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

COLUMNS = ("config", "cell", "mode", "threads", "rnnc ms", "rnnc speed-up", "peer",
           "peer ms", "peer speed-up", "ratio")


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return counts + [cores]


def scaling_rows(counts: list[int], measure: Callable[[int], list[dict[str, Any]]]
                 ) -> list[dict[str, Any]]:
    """One row per (configuration, cell, mode, thread count) from ``measure(threads)``, which
    returns ``bench_one``'s rows at that thread count; speed-ups are against the first count."""
    rows: list[dict[str, Any]] = []
    base: dict[tuple, tuple[float, float]] = {}
    for threads in counts:
        for r in measure(threads):
            key = (r["config"], r["cell"], r["mode"], r["peer"])
            base.setdefault(key, (r["rnnc_ms"], r["peer_ms"]))
            ours, theirs = base[key]
            rows.append({"config": r["config"], "cell": r["cell"], "mode": r["mode"],
                         "threads": threads, "rnnc_ms": r["rnnc_ms"],
                         "rnnc_speedup": ours / r["rnnc_ms"], "peer": r["peer"],
                         "peer_ms": r["peer_ms"], "peer_speedup": theirs / r["peer_ms"],
                         "ratio": r["ratio"]})
    return rows


def format_scaling(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table under :data:`COLUMNS`."""
    body = [(r["config"], r["cell"], r["mode"], str(r["threads"]), f"{r['rnnc_ms']:.3g}",
             f"{r['rnnc_speedup']:.2f}x", r["peer"], f"{r['peer_ms']:.3g}",
             f"{r['peer_speedup']:.2f}x", f"{r['ratio']:.2f}") for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) if i >= 3 and i != 6 else v.ljust(w)
                        for i, (v, w) in enumerate(zip(b, widths, strict=True))) for b in body]
    return "\n".join(lines)


def run_scaling(args: argparse.Namespace, configs: list, cores: int,
                set_threads: Callable[[argparse.Namespace, list[str], int], dict],
                bench_one: Callable[..., list[dict[str, Any]]], has_builtin: Callable[[str], bool]
                ) -> list[dict[str, Any]]:
    """Measure and print the scaling table; returns its rows."""
    def measure(threads: int) -> list[dict[str, Any]]:
        found = []
        for config in configs:
            for cell in args.cells:
                peers = ["torch"] if has_builtin(cell) else ["eager"]
                options = set_threads(args, peers, threads)
                for mode in args.modes:
                    found += bench_one(config, cell, mode, peers, args, options)
        return found

    rows = scaling_rows(thread_counts(cores), measure)
    print()
    print(format_scaling(rows), flush=True)
    return rows
