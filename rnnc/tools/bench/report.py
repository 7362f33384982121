"""The results of ``rnnc bench``: a text table, Markdown with the machine, JSON, a bar chart."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

COLUMNS = ("config", "cell", "mode", "peer", "rnnc ms", "rnnc min-max", "peer ms",
           "peer min-max", "ratio", "precision", "rnnc GFLOP/s", "peer GFLOP/s")


def _fmt(ms: float) -> str:
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The rows as strings under :data:`COLUMNS`."""
    return [(r["config"], r["cell"], r["mode"], r["peer"], _fmt(r["rnnc_ms"]),
             f"{_fmt(r['rnnc_min_ms'])}-{_fmt(r['rnnc_max_ms'])}", _fmt(r["peer_ms"]),
             f"{_fmt(r['peer_min_ms'])}-{_fmt(r['peer_max_ms'])}", f"{r['ratio']:.2f}",
             r.get("precision", "fp32"), f"{r.get('rnnc_gflops', 0.0):.3g}",
             f"{r.get('peer_gflops', 0.0):.3g}")
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
