"""Which BLAS, at how many threads, computes each GEMM shape fastest: measured once, remembered.

A candidate is a library name of :mod:`rnnc.backends.llvm.blas`, or ``name@threads`` for that
library at a thread count. :func:`choose` times the candidates on one shape and keeps the
fastest in memory and in ``blas.json`` under rnnc's cache directory; :func:`choose_for_site`
first drops the candidates that cannot win at that size, so that only the middle sizes are
ever measured.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rnnc import diskcache, process
from rnnc.backends.llvm import blas
from rnnc.backends.schedule import LlvmSchedule

__all__ = ["candidate_names", "choose", "choose_for_site", "split_candidate"]

_CHOICES: dict[str, str] = {}  # oldest first out beyond process.GEMM_CHOICES

# The tuning file holds one short entry per GEMM shape and candidate set.
_MAX_TUNING_BYTES = 1 << 20


def _default_cache_dir() -> Path:
    """The directory of ``blas.json``: rnnc's cache root (``$RNNC_CACHE_DIR`` first)."""
    return diskcache.default_root()


def _time_gemm(library: blas.Blas, m: int, n: int, k: int, dtype: np.dtype, reps: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.zeros((m, n), dtype)
    blas.call_gemm_ctypes(library, False, False, m, n, k, 1.0, a, k, b, n, 0.0, c, n)  # warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        blas.call_gemm_ctypes(library, False, False, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def split_candidate(name: str) -> tuple[blas.Blas, int | None]:
    """``"openblas@1"`` -> (the library, 1 thread); a plain name keeps its thread count."""
    base, _, threads = name.partition("@")
    if threads and (not threads.isdigit() or int(threads) < 1):
        raise ValueError(f"bad thread count in BLAS candidate {name!r}")
    return blas.get(base), (int(threads) if threads else None)


def candidate_names(libraries: Iterable[blas.Blas], threads: int) -> list[str]:
    """Each library at one thread and at ``threads`` (when it can change its count), sorted."""
    return sorted(f"{library.name}@{t}" for library in libraries
                  for t in ((1, threads) if library.threads_addr and threads > 1 else (threads,)))


def choose_for_site(m: int, n: int, k: int, dtype: np.dtype | type, names: list[str],
                    cache_dir: str | os.PathLike | None = None,
                    bounds: tuple[int, int] | None = None) -> str:
    """The candidate among ``names`` for one GEMM call of this shape.

    Only the middle sizes are worth measuring: up to ``bounds[0]`` multiply-adds only one
    thread, from ``bounds[1]`` only all of them (``LlvmSchedule.blas_one_thread_max_work``,
    ``.blas_all_threads_min_work``: the runner passes its schedule's; None, the defaults).
    """
    if bounds is None:
        bounds = (LlvmSchedule().blas_one_thread_max_work,
                  LlvmSchedule().blas_all_threads_min_work)
    work, (one_thread, all_threads) = m * n * k, bounds
    fit = [c for c in names if not c.endswith("@1")] if work >= all_threads else \
        [c for c in names if c.endswith("@1")] if work <= one_thread else names
    fit = fit or names
    if len(fit) == 1 or work == 0:
        return fit[-1]
    return choose(m, n, k, dtype, fit, cache_dir=cache_dir)


def choose(
    m: int,
    n: int,
    k: int,
    dtype: np.dtype | type,
    candidates: Iterable[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    reps: int = 5,
) -> str:
    """Return the fastest BLAS among candidates for one GEMM shape, measured once.

    The choice is remembered in memory and in ``blas.json`` under ``cache_dir``
    (default: rnnc's cache directory, ``$RNNC_CACHE_DIR`` or ``~/.cache/rnnc``), keyed by
    dtype, shape and candidate set; a stored choice is used only if it is one of the
    candidates. With one candidate nothing is measured.
    """
    dtype = np.dtype(dtype)
    names = sorted(set(candidates) if candidates is not None else blas.available())
    if not names:
        raise ValueError("choose() needs at least one BLAS candidate")
    for name in names:
        split_candidate(name)  # raises for an unknown name, listing the available ones
    if len(names) == 1:
        return names[0]
    key = f"{dtype.name}:{m}x{n}x{k}:{','.join(names)}"
    if key in _CHOICES:
        return _CHOICES[key]
    path = Path(cache_dir if cache_dir is not None else _default_cache_dir()) / "blas.json"
    stored = _read_choices(path)
    if stored.get(key) in names:
        return _remember(key, stored[key])
    best = _remember(key, min(names, key=lambda name: _measure(name, m, n, k, dtype, reps)))
    stored = _read_choices(path)  # another process may have written meanwhile
    stored[key] = best
    _write_choices(path, stored)
    return best


def _remember(key: str, choice: str) -> str:
    _CHOICES[key] = choice
    while len(_CHOICES) > process.GEMM_CHOICES:
        del _CHOICES[next(iter(_CHOICES))]
    return choice


def _measure(name: str, m: int, n: int, k: int, dtype: np.dtype, reps: int) -> float:
    library, threads = split_candidate(name)
    if threads is not None:
        blas.set_threads(threads, library)
    return _time_gemm(library, m, n, k, dtype, reps)


def _read_choices(path: Path) -> dict[str, str]:
    """The stored choices; a file that is not a JSON object of strings is deleted."""
    data = diskcache.read_file(path, _MAX_TUNING_BYTES)  # a regular file of ours, or None
    if data is None:
        return {}
    try:
        choices = json.loads(data)
    except (ValueError, RecursionError):
        choices = None
    if not isinstance(choices, dict):
        diskcache.discard(path)
        return {}
    return {k: v for k, v in choices.items() if isinstance(v, str)}


def _write_choices(path: Path, choices: dict[str, str]) -> None:
    # Through rnnc.diskcache: a private directory, an atomic rename, nothing left behind on
    # failure. An unusable directory only costs measuring again.
    if diskcache.private_directory(path.parent) is not None:
        data = json.dumps(choices, indent=1, sort_keys=True).encode()
        if len(data) <= _MAX_TUNING_BYTES:
            diskcache.write_file(path, data)
