"""benchmarks/gpu_check.py on the CPU (``--emulate --size tiny``): every part runs and the
Markdown and JSON reports say what ran, what was chosen and what was skipped at a budget."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", BENCHMARKS / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))  # the script puts its own folder first


def test_an_emulated_check_writes_every_part_and_what_it_skipped(gpu_check, tmp_path) -> None:
    # The bench budget lets the first row start and no other: C4 is skipped, and said so.
    # Inference only: the profile's C1-tiny call runs the same program (tiny sizes are one).
    assert gpu_check.main(["--emulate", "--size", "tiny", "--out", str(tmp_path),
                           "--configs", "C3,C4", "--cells", "gru", "--modes", "inference",
                           "--reps", "5", "--warmup", "1", "--budget", "bench=0.5",
                           "--tests", "tests/backends/test_cuda_device_calls.py"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    page = (tmp_path / "gpu_check.md").read_text()
    tests, bench, profile = (data["parts"][name] for name in ("tests", "bench", "profile"))

    # Without a GPU every cuda test skips: none fails, none errs, and the count is read.
    assert tests["status"] == "done" and tests["returncode"] == 0, tests["tail"]
    assert tests["counts"]["skipped"] > 0 and tests["failures"] == []
    assert "-m 'cuda and not slow'" in tests["command"]

    assert bench["status"] == "stopped at its budget"
    assert bench["skipped"] == ["C4-tiny gru inference"] and bench["errors"] == []
    assert {row["contestant"] for row in bench["rows"]} >= {"rnnc device", "rnnc numpy",
                                                            "cudnn", "eager"}
    assert all(row["median_ms"] > 0 for row in bench["rows"])
    # Emulated, fused_step="auto" fixes the path: the step is fused; nothing is timed, no
    # graph is captured.
    (path,) = bench["paths"]
    assert (path["program"], path["path"], path["chosen_by"], path["graph"], path["T"],
            path["B"]) == ("inference", "fused", "fused_step", False, 5, 2)
    assert path["first_call_ms"] > 0 and path["steady_ms"] > 0 and path["tuning_s"] == 0

    assert profile["status"] == "done" and profile["call"].startswith("C1-tiny gru inference")
    assert set(profile["rows"]) == {"device call", "device call (graph=False)",
                                    "NumPy round trip (x, parameters in; y, states out)",
                                    "copy x to the device",
                                    "copy y to the host"}
    assert all(r["host_ms"] > 0 and r["gpu_ms"] is None for r in profile["rows"].values())

    for heading in ("## Tests", "## Benchmarks", "## Launch paths", "## Profile"):
        assert heading in page
    assert "- bench: C4-tiny gru inference" in page and "| inference | 5 | 2 | fused |" in page


def test_without_a_gpu_the_gpu_parts_say_why_they_did_not_run(gpu_check, tmp_path,
                                                              monkeypatch) -> None:
    monkeypatch.setattr(gpu_check.cuda_vs_cudnn, "gpu_missing", lambda: "CuPy is not installed")
    assert gpu_check.main(["--out", str(tmp_path), "--parts", "bench,profile,flashrnn"]) == 0
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert {name: (p["status"], p["skipped"]) for name, p in parts.items()} == {
        "tests": ("not run", ["all: not in --parts bench,profile,flashrnn"]),
        "bench": ("not run", ["all: CuPy is not installed"]),
        "profile": ("not run", ["all: CuPy is not installed"]),
        "flashrnn": ("not run", ["all: CuPy is not installed"])}


def test_the_flashrnn_part_says_why_flashrnn_did_not_run(gpu_check, tmp_path,
                                                        monkeypatch) -> None:
    monkeypatch.setattr(gpu_check.flashrnn_peer, "flashrnn_missing",
                        lambda: "flashrnn does not import (ModuleNotFoundError: x)")
    assert gpu_check.main(["--emulate", "--out", str(tmp_path), "--parts", "flashrnn"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["parts"]["flashrnn"] == {
        "status": "not run", "budget_s": pytest.approx(0.16 * 7.5 * 60),
        "seconds": pytest.approx(0, abs=1),
        "skipped": ["all: flashrnn does not import (ModuleNotFoundError: x)"]}
    assert "- flashrnn: all: flashrnn does not import" in (tmp_path / "gpu_check.md").read_text()


def test_an_emulated_flashrnn_part_times_rnnc_beside_flashrnn(gpu_check, tmp_path) -> None:
    pytest.importorskip("flashrnn", reason="flashrnn, an optional GPU peer, is not installed")
    assert gpu_check.main(["--emulate", "--size", "tiny", "--out", str(tmp_path),
                           "--parts", "flashrnn", "--modes", "inference", "--reps", "5",
                           "--warmup", "1"]) == 0
    part = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]["flashrnn"]
    assert part["status"] == "done" and part["errors"] == [] and part["backends"] == ["vanilla"]
    assert [(r["cell"], r["contestant"]) for r in part["rows"]] == [
        ("slstm", "rnnc device"), ("slstm", "flashrnn vanilla"),
        ("lstm", "rnnc device"), ("lstm", "flashrnn vanilla")]
    peers = [r for r in part["rows"] if r["contestant"] != "rnnc device"]
    assert all(r["ratio"] > 0 and r["max_abs_diff_y"] < 1e-5 for r in peers)
    assert all(r["first_call_ms"] > 0 for r in part["rows"])
    page = (tmp_path / "gpu_check.md").read_text()
    assert "## FlashRNN" in page and "| C1-tiny | slstm | inference | flashrnn vanilla |" in page


def test_the_watchdog_writes_what_there_is_and_ends_the_run(gpu_check, tmp_path,
                                                            monkeypatch) -> None:
    args = gpu_check.argparse.Namespace(out=str(tmp_path), emulate=True, size="tiny",
                                        minutes=0.5)
    check = gpu_check.Check(args)
    check.data["environment"] = {}
    check.part("bench", 10.0)["rows"] = [{"config": "C1", "cell": "lstm", "mode": "inference",
                                         "contestant": "cudnn", "median_ms": float("inf"),
                                         "min_ms": 1.0, "max_ms": 2.0, "ratio": None}]
    check.child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the tests' pytest
    monkeypatch.setattr(gpu_check.os, "_exit", lambda code: (_ for _ in ()).throw(
        SystemExit(code)))
    with pytest.raises(SystemExit) as stopped:
        gpu_check._stop(check)
    assert stopped.value.code == 3
    assert check.child.wait(timeout=10) == -9  # not left running on the GPU
    data = json.loads((tmp_path / "gpu_check.json").read_text())  # strict JSON: no Infinity
    assert data["stopped_by_watchdog"] == "during bench, at 0.5 min"
    assert data["parts"]["bench"]["status"] == "running"
    assert data["parts"]["bench"]["rows"][0]["median_ms"] is None
    assert "**Stopped by the watchdog** during bench" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--budget", "nope=3"], "the parts are tests, bench, profile, flashrnn"),
    (["--flashrnn-cells", "gru"], "FlashRNN runs slstm, lstm, not gru"),
    (["--parts", "tests,everything"], "unknown parts ['everything']"),
    (["--reps", "3"], "--reps must be at least 5")])
def test_bad_options_are_refused(gpu_check, capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(argv)
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_the_default_tests_are_the_files_that_mark_cuda(gpu_check) -> None:
    files = gpu_check.cuda_test_files()
    assert "tests/backends/test_cuda_backend.py" in files
    assert "tests/rnnc/test_torch_device.py" in files
    assert "tests/backends/test_cuda_fused_step.py" not in files


def test_the_tests_part_stops_at_its_budget(gpu_check) -> None:
    record: dict = {"skipped": []}
    files = ["tests/backends/test_cuda_backend.py"]
    assert gpu_check.run_tests(record, 0.2, files) == "stopped at its budget"
    assert record["skipped"] == ["the tests not finished after 0.2 s"]
    assert record["returncode"] == -9 and record["counts"] == {}  # killed, nothing finished


def test_rnnc_needs_no_particular_cupy_build() -> None:
    """A GPU host may have CuPy for CUDA 13 (docs/device-calls.md): rnnc imports ``cupy`` by
    module name and never asks for a distribution such as cupy-cuda12x."""
    root = Path(__file__).parents[2]
    sources = [*(root / "rnnc").rglob("*.py"), *(root / "backends").rglob("*.py")]
    named = [str(path.relative_to(root)) for path in sources
             if re.search(r"cupy[-_]cuda\d", path.read_text())]
    asked = [str(path.relative_to(root)) for path in (root / "backends" / "cuda").glob("*.py")
             if re.search(r"importlib\.metadata|pkg_resources", path.read_text())]
    assert named == [] and asked == []
