"""One prepared check of rnnc's CUDA backend on a lent GPU, in under eight minutes on an H100.

``python benchmarks/gpu_check.py [--out DIR]`` (docs/device-calls.md says how to install rnnc on
a GPU host without PyPI) runs, each part stopped at its time budget:

1. ``tests``: the ``cuda``-marked tests (a pytest subprocess over the test files that mark any);
2. ``bench``: ``benchmarks/cuda_vs_cudnn.py``'s measurements (C1-C4; lstm, gru, layer-norm
   lstm; inference and training; device-resident and NumPy round trip; cuDNN, ``jax.lax.scan``
   where JAX has a GPU, a PyTorch eager loop), through that script's own functions, with the
   launch path ``fused_step="auto"`` chose for each shape (``Function.launch_report``: fused
   step, persistent, GEMM plus kernel, graph or not) and the first call's tuning time apart
   from the steady state;
3. ``profile``: one C1 call under ``cupyx.profiler.benchmark``: host time, kernel (GPU) time of
   a device call, the copies of a NumPy round trip, and host time without a CUDA graph;
4. ``flashrnn``: ``benchmarks/flashrnn_peer.py``'s rows at C1 (sLSTM with 4 heads, LSTM):
   rnnc's device call beside FlashRNN's ``cuda_fused`` and ``cuda`` backends, each its own row,
   where ``flashrnn`` imports (the report says why not where it does not; docs/benchmarks.md
   says how to carry its wheels).

It writes ``gpu_check.md`` and ``gpu_check.json`` into ``--out`` (default: the current
directory), saying what each part skipped at its budget. A watchdog thread writes what is there
and ends the process at ``--minutes``, whatever hangs. ``--emulate --size tiny`` runs the same
code on the CPU (rnnc emulated, peers on the CPU; cupyx replaced by a host clock), which the
test suite does so this script cannot rot; its times mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# JAX takes 75 % of the GPU's memory on first use unless told not to: CuPy and PyTorch share it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_vs_cudnn  # noqa: E402  (benchmarks/ is no package: the script beside this one)
import flashrnn_peer  # noqa: E402
from gpu_check_report import to_markdown  # noqa: E402

import rnnc  # noqa: E402
from rnnc.tools import bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Shares of --minutes per part; the rest is slack for imports, compiles and the report.
SHARES = {"tests": 0.25, "bench": 0.42, "profile": 0.07, "flashrnn": 0.16}
CELLS = "lstm,gru,ln_lstm"


class Check:
    """The report as it is built: environment, each part's status, budget, results, skips."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out, self.lock, self.started = Path(args.out), threading.Lock(), time.perf_counter()
        self.data: dict[str, Any] = {
            "emulate": args.emulate, "size": args.size, "minutes": args.minutes,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "parts": {}}
        self.current = ""
        self.child: subprocess.Popen | None = None  # the tests' pytest, while it runs

    def part(self, name: str, budget: float) -> dict[str, Any]:
        """A new part's record: ``status`` "running" until :meth:`done`."""
        with self.lock:
            self.current = name
            record = self.data["parts"][name] = {"status": "running", "budget_s": budget,
                                                 "skipped": []}
            record["_start"] = time.perf_counter()
        print(f"gpu_check: {name} (budget {budget:g} s)", flush=True)
        return record

    @staticmethod
    def done(record: dict[str, Any], status: str = "done") -> None:
        record["seconds"] = time.perf_counter() - record.pop("_start")
        record["status"] = status

    def write(self) -> tuple[Path, Path]:
        """Write the JSON and Markdown reports (also from the watchdog, mid-part)."""
        with self.lock:
            self.data["seconds"] = time.perf_counter() - self.started
            data = _plain(self.data)
        self.out.mkdir(parents=True, exist_ok=True)
        json_path, md_path = self.out / "gpu_check.json", self.out / "gpu_check.md"
        json_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        md_path.write_text(to_markdown(data))
        return json_path, md_path


def _plain(value: Any) -> Any:
    """``value`` as strict JSON: no private keys, no infinities, no NumPy scalars."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def environment(emulate: bool) -> dict[str, Any]:
    """Versions and the device; what is missing for a GPU run."""
    found = {name: importlib.util.find_spec(name) is not None
             for name in ("cupy", "torch", "jax", "flashrnn", "hypothesis", "xdist",
                          "scipy_openblas32")}
    env: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                           "rnnc": getattr(rnnc, "__version__", "?"), "found": found,
                           "missing": None if emulate else cuda_vs_cudnn.gpu_missing()}
    if found["torch"]:
        import torch

        env["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
    if found["jax"]:
        import jax

        env["jax"] = f"{jax.__version__} ({jax.default_backend()})"
    if found["cupy"] and not emulate and env["missing"] is None:
        import cupy

        from rnnc.backends.cuda import autotune

        env["cupy"] = cupy.__version__
        env["device"] = autotune.device_identity(cupy)
    return env


def cuda_test_files() -> list[str]:
    """The test files that mark any test ``cuda``, the fuzz tests (the longest) last."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if "mark.cuda" in p.read_text(errors="replace"))
    return sorted(files, key=lambda name: "/fuzz/" in name)


# pytest -v's line per test: "tests/x.py::test_y[param] PASSED    [ 10%]"
_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def run_tests(record: dict[str, Any], budget: float, files: list[str],
              check: Check | None = None) -> str:
    """The ``cuda`` tests of ``files`` in a pytest subprocess, killed at ``budget`` seconds;
    each test's outcome is read from its own line, so a stopped run still tells what ran."""
    if importlib.util.find_spec("hypothesis") is None:
        record["skipped"].append("all: hypothesis is not installed (tests/conftest.py imports "
                                 "it; docs/device-calls.md brings its wheel)")
        return "not run"
    # addopts cleared: no -n (pytest-xdist may be missing); the slow ones stay out.
    command = [sys.executable, "-m", "pytest", "-v", "-rfE", "-m", "cuda and not slow",
               "--durations=10", "-o", "addopts=", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", *files]
    record["command"] = shlex.join(["python", *command[1:]])
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if check is not None:
        check.child = process
    try:
        output, _ = process.communicate(timeout=budget)
        status = "done"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the pytest process group this part started
        output, _ = process.communicate()
        status = "stopped at its budget"
        record["skipped"].append(f"the tests not finished after {budget:g} s")
    lines = output.splitlines()
    outcomes = dict(m.groups() for m in map(_OUTCOME.match, lines) if m)
    record["returncode"] = process.returncode
    record["counts"] = {word.lower(): list(outcomes.values()).count(word)
                        for word in sorted(set(outcomes.values()))}
    record["failures"] = [f"{outcome} {test}" for test, outcome in outcomes.items()
                          if outcome in ("FAILED", "ERROR")]
    record["failures"] += [line for line in lines if line.startswith("ERROR ") and
                           "::" not in line]  # a file that could not be collected
    summary = next((line for line in reversed(lines) if re.search(r"\d+ \w+ in ", line)), "")
    record["summary"] = summary.strip("= ")
    record["tail"] = lines[-30:]  # the slowest tests and the summary
    return status


def bench_rows(record: dict[str, Any], budget: float, args: argparse.Namespace,
               place: cuda_vs_cudnn.Place) -> str:
    """cuda_vs_cudnn's contestants per configuration, cell and mode until ``budget``: a row
    starts only while the time left exceeds the longest row so far."""
    options = {"graph": True, "precision": "highest"}
    record["rows"], record["paths"], record["errors"] = [], [], []
    start, longest = time.perf_counter(), 0.0
    # Breadth first: every configuration and cell in inference before any in training, so a
    # budget that runs out leaves the same kind of row missing everywhere, not C3 and C4.
    for mode in args.modes.split(","):
        for cell in args.cells.split(","):
            for config_name in args.configs.split(","):
                config = bench.CONFIGS[config_name]
                config = bench.tiny(config) if args.size == "tiny" else config
                label = f"{config.name} {cell} {mode}"
                if budget - (time.perf_counter() - start) <= longest:
                    record["skipped"].append(label)
                    continue
                row_start = time.perf_counter()
                bench_row(record, config, cell, mode, place, options, args)
                print(f"gpu_check:   {label} {time.perf_counter() - row_start:.1f} s", flush=True)
                longest = max(longest, time.perf_counter() - row_start)
    return "stopped at its budget" if record["skipped"] else "done"


def bench_row(record: dict[str, Any], config: bench.Config, cell: str, mode: str,
              place: cuda_vs_cudnn.Place, options: dict, args: argparse.Namespace) -> None:
    """Time every contestant of one row; keep the device function's launch paths."""
    label = {"config": config.name, "cell": cell, "mode": mode}
    x = np.random.default_rng(0).standard_normal((config.T, config.B, config.I)) \
        .astype(np.float32)
    compiled: dict[str, Any] = {}
    try:
        calls = cuda_vs_cudnn.contestants(bench.CELLS[cell], cell, config, mode, place,
                                          options, x, compiled)
    except Exception as err:  # a check reports what failed and goes on
        record["errors"].append({**label, "error": f"{type(err).__name__}: {err}"})
        return
    times: dict[str, tuple[float, float, float]] = {}
    first_ms = None
    for name, call in calls.items():
        try:
            if name == "rnnc device":
                begin = time.perf_counter()
                call()
                place.sync()
                first_ms = (time.perf_counter() - begin) * 1e3
            times[name] = cuda_vs_cudnn.timed(call, place.sync, args.reps, args.warmup)
        except Exception as err:
            record["errors"].append({**label, "contestant": name,
                                     "error": f"{type(err).__name__}: {err}"})
    ours = times.get("rnnc device")
    record["rows"] += cuda_vs_cudnn.ratio_rows(label, times)
    function = compiled.get("rnnc device")
    if function is not None:
        for path in function.launch_report():
            record["paths"].append({**label, **path, "first_call_ms": first_ms,
                                    "steady_ms": ours[0] if ours else None})
            print(f"gpu_check:     {path['program']} T={path['T']} B={path['B']}: "
                  f"{path['path']} ({path['chosen_by']}, tuning {path['tuning_s']:.3f} s, "
                  f"graph {'yes' if path['graph'] else 'no'}); first call "
                  f"{first_ms or 0:.1f} ms, steady {ours[0] if ours else 0:.3f} ms", flush=True)


def profile(record: dict[str, Any], budget: float, cell: str, size: str,
            place: cuda_vs_cudnn.Place, reps: int) -> str:
    """Host, kernel and copy times of one C1 inference call of ``cell``, each measurement
    started only while ``budget`` has time left."""
    start = time.perf_counter()
    rows: dict[str, Any] = {}

    def measured(name: str, call: Callable[[], Any]) -> None:
        if time.perf_counter() - start >= budget:
            record["skipped"].append(name)
        else:
            rows[name] = measure(call, place, reps)

    config = bench.CONFIGS["C1"]
    config = bench.tiny(config) if size == "tiny" else config
    spec = bench.CELLS[cell]
    record["call"] = f"{config.name} {cell} inference (T={config.T}, B={config.B}, H={config.H})"
    x = np.random.default_rng(0).standard_normal((config.T, config.B, config.I)) \
        .astype(np.float32)
    functions = {graph: rnnc.compile(spec.factory(config.I, config.H), backend="cuda",
                                     emulate=place.emulate, graph=graph)
                 for graph in (True, False)}
    flat_host = functions[True].pack(bench.layer_params(spec, config)[0][0])
    flat, x_dev = place.device_array(flat_host), place.device_array(x)
    fn = functions[True]
    measured("device call", lambda: fn(x_dev, flat))
    measured("device call (graph=False)", lambda: functions[False](x_dev, flat))
    measured("NumPy round trip (x, parameters in; y, states out)", lambda: fn(x, flat_host))
    y = fn(x_dev, flat)[0]["y"]
    measured("copy x to the device", lambda: place.device_array(x))
    measured("copy y to the host", lambda: y.get() if hasattr(y, "get") else np.array(y))
    record["rows"] = rows
    record["timer"] = "host clock (emulated: no GPU times)" if place.emulate else \
        "cupyx.profiler.benchmark"
    return "stopped at its budget" if record["skipped"] else "done"


def measure(call: Callable[[], Any], place: cuda_vs_cudnn.Place, reps: int) -> dict[str, Any]:
    """Median host and GPU milliseconds of ``call`` (GPU: None in emulation)."""
    if place.emulate:
        times = []
        for _ in range(reps + 2):
            begin = time.perf_counter()
            call()
            times.append((time.perf_counter() - begin) * 1e3)
        return {"host_ms": statistics.median(times[2:]), "gpu_ms": None}
    from cupyx.profiler import benchmark

    result = benchmark(call, n_repeat=reps, n_warmup=3)
    return {"host_ms": float(np.median(result.cpu_times)) * 1e3,
            "gpu_ms": float(np.median(result.gpu_times)) * 1e3}


def flashrnn_rows(record: dict[str, Any], budget: float, args: argparse.Namespace,
                  place: cuda_vs_cudnn.Place) -> str:
    """flashrnn_peer's rows at C1 per mode and cell until ``budget``, as :func:`bench_rows`
    does: rnnc's device call beside each FlashRNN backend (``vanilla`` in emulation)."""
    record["rows"], record["errors"] = [], []
    record["backends"] = backends = ("vanilla",) if place.emulate else \
        flashrnn_peer.GPU_BACKENDS
    config = bench.tiny(bench.CONFIGS["C1"]) if args.size == "tiny" else bench.CONFIGS["C1"]
    start, longest = time.perf_counter(), 0.0
    for mode in args.modes.split(","):
        for cell in args.flashrnn_cells.split(","):
            label = f"{config.name} {cell} {mode}"
            # The first row also JIT-compiles FlashRNN's kernels: it is the longest.
            if budget - (time.perf_counter() - start) <= longest:
                record["skipped"].append(label)
                continue
            row_start = time.perf_counter()
            flashrnn_peer.measure(record, config, cell, mode, place, backends, "highest",
                                  args.reps, args.warmup)
            print(f"gpu_check:   {label} {time.perf_counter() - row_start:.1f} s", flush=True)
            longest = max(longest, time.perf_counter() - row_start)
    return "stopped at its budget" if record["skipped"] else "done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory of gpu_check.md and .json")
    parser.add_argument("--minutes", type=float, default=7.5,
                        help="the whole run's limit; parts get shares of it (default 7.5)")
    parser.add_argument("--parts", default=",".join(SHARES))
    parser.add_argument("--tests", nargs="*", help="test files (default: those marking cuda)")
    parser.add_argument("--configs", default="C1,C2,C3,C4")
    parser.add_argument("--cells", default=CELLS, help="the first is also profiled")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--flashrnn-cells", default=",".join(flashrnn_peer.CELLS),
                        help="the cells the flashrnn part times against FlashRNN")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                        help="override one part's budget, e.g. --budget bench=60")
    parser.add_argument("--emulate", action="store_true",
                        help="run on the CPU: rnnc emulated, peers on the CPU")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    budgets = {part: share * args.minutes * 60 for part, share in SHARES.items()}
    for item in args.budget:
        part, _, seconds = item.partition("=")
        if part not in SHARES:
            parser.error(f"--budget {item!r}: the parts are {', '.join(SHARES)}")
        budgets[part] = float(seconds)
    unknown = sorted(set(parts) - set(SHARES))
    if unknown or args.reps < 5:
        parser.error(f"unknown parts {unknown}" if unknown else "--reps must be at least 5")
    not_flashrnn = sorted(set(args.flashrnn_cells.split(",")) - set(flashrnn_peer.CELLS))
    if not_flashrnn:
        parser.error(f"--flashrnn-cells: FlashRNN runs {', '.join(flashrnn_peer.CELLS)}, "
                     f"not {', '.join(not_flashrnn)}")
    check = Check(args)
    watchdog = threading.Timer(args.minutes * 60, _stop, (check,))
    watchdog.daemon = True
    watchdog.start()
    check.current = "environment"  # importing torch and JAX, JAX finding its GPU
    check.data["environment"] = env = environment(args.emulate)
    missing = env["missing"]
    for part in SHARES:
        record = check.part(part, budgets[part])
        if part not in parts:
            record["skipped"].append(f"all: not in --parts {args.parts}")
            check.done(record, "not run")
        elif part != "tests" and missing:
            record["skipped"].append(f"all: {missing}")
            check.done(record, "not run")
        elif part == "tests":
            check.done(record, run_tests(record, budgets[part], args.tests or cuda_test_files(),
                                         check))
        elif part == "flashrnn":
            why_not = flashrnn_peer.flashrnn_missing()
            if why_not:
                record["skipped"].append(f"all: {why_not}")
            check.done(record, "not run" if why_not else flashrnn_rows(
                record, budgets[part], args, cuda_vs_cudnn.Place(args.emulate)))
        elif part == "bench":
            check.done(record, bench_rows(record, budgets[part], args,
                                          cuda_vs_cudnn.Place(args.emulate)))
        else:
            check.done(record, profile(record, budgets[part], args.cells.split(",")[0], args.size,
                                       cuda_vs_cudnn.Place(args.emulate), args.reps))
        check.write()
    watchdog.cancel()
    json_path, md_path = check.write()
    print(f"gpu_check: wrote {md_path} and {json_path}")
    return 0


def _stop(check: Check) -> None:
    """The watchdog: write what there is, say which part was stopped, end the process."""
    check.data["stopped_by_watchdog"] = f"during {check.current}, at {check.data['minutes']} min"
    if check.child is not None and check.child.poll() is None:
        os.killpg(check.child.pid, signal.SIGKILL)  # the tests' pytest, started by this check
    for _ in range(3):  # the main thread may change a record while it is copied: try again
        try:
            check.write()
            break
        except RuntimeError:
            time.sleep(0.1)
    print(f"gpu_check: stopped by the watchdog during {check.current}", flush=True)
    os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
