"""Smoke-run every script in examples/ at a small size, each in its own process."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 120


def run(script: str, *args: str, cwd: pathlib.Path, timeout: float = TIMEOUT) -> str:
    """Run ``examples/<script>`` with ``args`` in ``cwd``; return its output, failing on rc != 0."""
    # One BLAS/OpenMP thread each: the smoke runs are tiny, and spare threads only spin.
    env = {**os.environ, "RNNC_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}:\n{out[-4000:]}"
    return out


def check_custom_cells(tmp_path: pathlib.Path) -> None:
    out = run("custom_cells.py", "--steps", "5", "--hidden", "8", "--backend", "numpy",
              cwd=tmp_path)
    for name in ("peephole_lstm", "layer_norm_lstm", "mgu", "indrnn", "gru", "gru_v3"):
        assert re.search(rf"^{name}\s+max\|rnnc - numpy\|", out, re.M), out


def check_ir_tour(tmp_path: pathlib.Path) -> None:
    out = run("ir_tour.py", "--out", "tmp", "--hidden", "4", cwd=tmp_path)
    assert "wrote" in out, out
    for mode in ("inference", "forward", "backward"):
        for ext in ("txt", "dot"):
            path = tmp_path / "tmp" / f"lstm_{mode}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, path


def check_char_lm(tmp_path: pathlib.Path) -> None:
    out = run("char_lm.py", "--hidden", "16", "--steps", "40", "--seq-len", "16", "--batch", "8",
              "--print-every", "20", "--sample-len", "40", "--out", "lm", cwd=tmp_path)
    m = re.search(r"^loss: first ([\d.]+) last ([\d.]+)", out, re.M)
    assert m, out
    first, last = float(m[1]), float(m[2])
    assert last < first - 0.1, out
    assert (tmp_path / "lm" / "loss.csv").read_text().startswith("step,loss\n")
    assert len((tmp_path / "lm" / "loss.csv").read_text().splitlines()) == 41
    # matplotlib is in the test extra, so the loss curve must be drawn.
    assert (tmp_path / "lm" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert re.search(r"^sample \(temperature [\d.]+\):\nShall I .{40}", out, re.M | re.S), out


def check_min_gru_lm(tmp_path: pathlib.Path) -> None:
    out = run("min_gru_lm.py", "--hidden", "16", "--steps", "40", "--seq-len", "16", "--batch",
              "8", "--print-every", "20", "--sample-len", "40", "--out", "lm", "--compare",
              cwd=tmp_path)
    # Every layer's compiled programs are the parallel form: one linear_scan, no time loop.
    for k in (0, 1):
        assert re.search(rf"^parallel form, layer {k} .*forward: no time loop, 1 linear_scan; "
                         r"backward: no time loop, 1 linear_scan", out, re.M), out
    assert re.search(r"^parallel_scan=False, layer 0 .*forward: a time loop", out, re.M), out
    m = re.search(r"^one training step .*: parallel form [\d.]+ ms, time loop [\d.]+ ms.*"
                  r"max \|gradient difference\| ([\d.e+-]+)$", out, re.M)
    assert m and float(m[1]) < 1e-4, out
    m = re.search(r"^loss: first ([\d.]+) last ([\d.]+)", out, re.M)
    assert m, out
    assert float(m[2]) < float(m[1]) - 0.1, out
    assert (tmp_path / "lm" / "loss.csv").read_text().startswith("step,loss\n")
    assert len((tmp_path / "lm" / "loss.csv").read_text().splitlines()) == 41
    assert re.search(r"^sample \(temperature [\d.]+\):\nShall I .{40}", out, re.M | re.S), out
    # The NumPy backend runs the parallel form too (there by default).
    out = run("min_gru_lm.py", "--backend", "numpy", "--hidden", "8", "--steps", "5", "--seq-len",
              "8", "--batch", "4", "--sample-len", "10", "--out", "np", cwd=tmp_path)
    assert re.search(r"^parallel form, layer 1 .*forward: no time loop, 1 linear_scan", out,
                     re.M), out
    assert re.search(r"^sample \(temperature [\d.]+\):\nShall I .{10}", out, re.M | re.S), out


def check_torch_interop(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    out = run("torch_interop.py", "--steps", "2", "--backend", "numpy", cwd=tmp_path)
    assert re.search(r"^step\s+1\s+torch\.nn\.LSTM [\d.]+\s+rnnc\.torch\.RNN [\d.]+", out,
                     re.M), out


def check_ddp_train(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    out = run("ddp_train.py", "--procs", "2", "--steps", "2", cwd=tmp_path)
    assert "parameters identical on all 2 ranks: True" in out, out


def check_published_cells(tmp_path: pathlib.Path) -> None:
    out = run("published_cells.py", "--steps", "30", "--hidden", "8", cwd=tmp_path)
    for name in ("ligru", "mogrifier_lstm", "lstmp", "indrnn", "mlstm", "layer_norm_gru",
                 "zoneout_lstm", "variational_lstm"):
        m = re.search(rf"^{name}\s+loss: first ([\d.]+) last ([\d.]+)", out, re.M)
        assert m, out
        assert float(m[2]) < 0.7 * float(m[1]), out


SMOKE = {
    "custom_cells.py": check_custom_cells,
    "ir_tour.py": check_ir_tour,
    "char_lm.py": check_char_lm,
    "min_gru_lm.py": check_min_gru_lm,
    "torch_interop.py": check_torch_interop,
    "ddp_train.py": check_ddp_train,
    "published_cells.py": check_published_cells,
}


def test_every_example_has_a_smoke_test() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == sorted(SMOKE), (
        f"examples without a smoke test: {sorted(set(scripts) - set(SMOKE))}; "
        f"smoke tests without an example: {sorted(set(SMOKE) - set(scripts))}")


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_example_runs(script: str, tmp_path: pathlib.Path) -> None:
    SMOKE[script](tmp_path)


def _char_lm_last_loss(precision: str, tmp_path: pathlib.Path) -> float:
    # docs/precision.md's command: the defaults (LSTM, hidden 128, seq 64, batch 32, seed 0)
    out = run("char_lm.py", "--steps", "500", "--print-every", "100", "--sample-len", "10",
              "--precision", precision, "--out", precision, cwd=tmp_path, timeout=3600)
    return float(re.search(r"^loss: first [\d.]+ last ([\d.]+)", out, re.M)[1])


@pytest.mark.slow
def test_char_lm_bf16_loss_within_two_percent_of_fp32(tmp_path: pathlib.Path) -> None:
    """Training with bfloat16 GEMMs ends within 2% of float32's loss (docs/precision.md)."""
    fp32, bf16 = (_char_lm_last_loss(p, tmp_path) for p in ("fp32", "bf16"))
    assert abs(bf16 - fp32) <= 0.02 * fp32, (fp32, bf16)
