"""Smoke test of ``rnnc bench`` at a tiny size: table shape and sane ratios, never timings."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from rnnc.tools import bench  # noqa: E402


def test_bench_tiny_table(tmp_path, capsys) -> None:
    markdown, data = tmp_path / "bench.md", tmp_path / "bench.json"
    code = bench.main(["--size", "tiny", "--backend", "numpy", "--configs", "C3",
                       "--cells", "lstm", "--modes", "training", "--peers", "torch,eager",
                       "--reps", "5", "--warmup", "1", "--no-compile-time",
                       "--markdown", str(markdown), "--json", str(data),
                       "--png", str(tmp_path / "bench.png")])
    assert code == 0
    out = capsys.readouterr().out
    header = [ln for ln in out.splitlines() if ln.startswith("config")][-1]
    assert header.split() == " ".join(bench.COLUMNS).split()
    import json

    rows = json.loads(data.read_text())["rows"]
    assert [(r["config"], r["cell"], r["mode"], r["peer"]) for r in rows] == [
        ("C3-tiny", "lstm", "training", "torch"), ("C3-tiny", "lstm", "training", "eager")]
    for r in rows:
        assert r["reps"] == 5
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert math.isclose(r["ratio"], r["rnnc_ms"] / r["peer_ms"])
        assert r["max_abs_diff"] < 1e-4  # rnnc and the peer compute the same cell
    text = markdown.read_text()
    assert "| config | cell | mode | peer | rnnc ms |" in text
    assert "torch" in text and "numpy" in text
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_custom_cells_match_eager_peer() -> None:
    import argparse

    args = argparse.Namespace(backend="numpy", reps=1, warmup=1)
    config = bench.tiny(bench.CONFIGS["C4"])
    for cell in ("mgu", "peephole_lstm", "ln_lstm"):
        rows = bench.bench_one(config, cell, "inference", ["eager"], args, {})
        assert len(rows) == 1 and rows[0]["max_abs_diff"] < 1e-4, cell


def test_scaling_thread_counts_and_speedups() -> None:
    from rnnc.tools.bench.scaling import scaling_rows, thread_counts

    assert thread_counts(1) == [1]
    assert thread_counts(2) == [1, 2]
    assert thread_counts(6) == [1, 2, 4, 6]
    assert thread_counts(16) == [1, 2, 4, 8, 16]

    def measure(threads: int) -> list[dict]:  # rnnc halves its time per doubling, torch not
        return [{"config": "C1", "cell": "lstm", "mode": "inference", "peer": "torch",
                 "rnnc_ms": 8.0 / threads, "peer_ms": 6.0, "ratio": (8.0 / threads) / 6.0}]

    rows = scaling_rows([1, 2, 4], measure)
    assert [r["threads"] for r in rows] == [1, 2, 4]
    assert [r["rnnc_speedup"] for r in rows] == [1.0, 2.0, 4.0]
    assert [r["peer_speedup"] for r in rows] == [1.0, 1.0, 1.0]


def test_bench_scaling_tiny(tmp_path, capsys) -> None:
    import json

    data = tmp_path / "scaling.json"
    code = bench.main(["--size", "tiny", "--backend", "numpy", "--configs", "C3",
                       "--cells", "lstm,mgu", "--modes", "inference", "--threads", "2",
                       "--scaling", "--reps", "1", "--warmup", "1", "--json", str(data)])
    assert code == 0
    out = capsys.readouterr().out
    assert "rnnc speed-up" in out and "peer speed-up" in out
    rows = json.loads(data.read_text())["scaling"]
    assert [(r["cell"], r["threads"], r["peer"]) for r in rows] == [
        ("lstm", 1, "torch"), ("mgu", 1, "eager"), ("lstm", 2, "torch"), ("mgu", 2, "eager")]
    assert all(r["rnnc_ms"] > 0 and r["peer_ms"] > 0 for r in rows)


def test_gpu_benchmark_runs_in_emulation(capsys) -> None:
    """benchmarks/cuda_vs_cudnn.py at a tiny size with rnnc emulated and peers on the CPU:
    every contestant runs and the table has a row for each; its times mean nothing."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "cuda_vs_cudnn.py"
    spec = importlib.util.spec_from_file_location("cuda_vs_cudnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--emulate", "--size", "tiny", "--configs", "C3,C4", "--cells",
                        "gru", "--modes", "training", "--reps", "5", "--warmup", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if " | " in line]
    names = [(row[0], row[3]) for row in rows]
    expected = {"rnnc device", "rnnc numpy", "cudnn", "eager"} | (
        {"jax"} if bench.peers.jax_available() else set())
    assert {name for config, name in names if config == "C3-tiny"} == expected
    # C4 is stacked and bidirectional: the NumPy round trip only, no device row yet
    assert {name for config, name in names if config == "C4-tiny"} == expected - {"rnnc device"}
    assert all(float(row[4].split()[0]) > 0 for row in rows)


def test_bench_bf16_rows_beside_the_fp32_ones(tmp_path) -> None:
    import json

    data = tmp_path / "bench.json"
    code = bench.main(["--size", "tiny", "--backend", "numpy", "--configs", "C3", "--cells",
                       "lstm,ln_lstm", "--modes", "inference", "--peers", "torch", "--precision",
                       "bf16", "--reps", "1", "--warmup", "1", "--no-compile-time", "--json",
                       str(data), "--clock", "cpu"])
    assert code == 0
    rows = json.loads(data.read_text())["rows"]
    # rnnc in float32 is a peer of every bf16 row set: the layer-norm LSTM, which has no
    # built-in peer, gets its bf16 / fp32 ratio too.
    assert [(r["cell"], r["peer"], r["precision"]) for r in rows] == [
        ("lstm", "torch", "fp32"), ("lstm", "rnnc-fp32", "bf16"), ("lstm", "torch-bf16", "bf16"),
        ("lstm", "torch-autocast", "bf16"), ("ln_lstm", "rnnc-fp32", "bf16")]
    for r in rows:
        assert r["rnnc_gflops"] > 0 and r["peer_gflops"] > 0
        assert math.isclose(r["rnnc_gflops"] * r["rnnc_ms"], r["peer_gflops"] * r["peer_ms"])
        # the same cell: bfloat16 rounding apart (nn.LSTM in bf16 rounds its elementwise too)
        assert r["max_abs_diff"] < (1e-4 if r["precision"] == "fp32" else 5e-2)
    flop = bench.CONFIGS["C1"]
    assert bench.gemm_flop(bench.CELLS["lstm"], flop, "inference") == \
        2 * 4 * flop.H * (flop.I + flop.H) * flop.T * flop.B * flop.layers * flop.directions


def test_cells_with_feature_shapes_match_eager_peer() -> None:
    """The sLSTM (einsum and per-head-slices forms) and the selective SSM: rnnc.compile and
    the PyTorch loop of their step functions agree, forward and (training) after backward."""
    import argparse

    args = argparse.Namespace(backend="numpy", reps=1, warmup=1)
    config = bench.tiny(bench.CONFIGS["C1"])
    for cell in ("slstm", "slstm_slices", "selective_ssm"):
        for mode in ("inference", "training"):
            rows = bench.bench_one(config, cell, mode, ["eager"], args, {})
            assert len(rows) == 1 and rows[0]["max_abs_diff"] < 1e-4, (cell, mode)
    assert "slstm" not in bench.DEFAULT_CELLS  # run by name: --cells slstm,selective_ssm


def test_timed_reads_the_chosen_clock(monkeypatch) -> None:
    from rnnc.tools.bench import harness

    ticks = iter(range(1000))
    monkeypatch.setitem(harness.CLOCKS, "cpu", lambda: float(next(ticks)))
    timings, firsts = harness.timed({"f": lambda: 7}, reps=3, warmup=1, clock="cpu")
    assert firsts == {"f": 7} and timings["f"].first == 1.0
    assert timings["f"].times == [1.0, 1.0, 1.0]  # one tick per call: the fake clock was read


# The forward of a bfloat16 peer against the float32 one: bfloat16 keeps 8 significant bits,
# so an operand near 1 moves by up to 2**-9 when rounded; five steps of a cell whose outputs lie
# in (-1, 1) stay within 4 spacings of bfloat16 at 1 (4 * 2**-8). The lower bound shows that the
# peer ran in bfloat16 at all: the float32 paths agree to 1e-6.
BF16_FORWARD_TOLERANCE = 4 * 2.0**-8


def _eager_forward(cell: str, **kwargs):
    import numpy as np
    import torch

    from rnnc.tools.bench.peers import torch_eager_call

    config = bench.tiny(bench.CONFIGS["C3"])
    spec = bench.CELLS[cell]
    fn, label = torch_eager_call(spec, config, bench.layer_params(spec, config), "inference",
                                 **kwargs)
    x = np.random.default_rng(7).standard_normal((config.T, config.B, config.I))
    return fn(torch.from_numpy(x.astype(np.float32))), label


@pytest.mark.parametrize("cell", ["lstm", "ln_lstm"])
def test_autocast_eager_loop_is_the_float32_loop_in_bf16(cell: str) -> None:
    import torch

    y32, _ = _eager_forward(cell)
    y16, label = _eager_forward(cell, autocast=True)
    assert label == "eager loop autocast" and y16.dtype == torch.float32
    diff = float((y16 - y32).abs().max())
    assert 1e-4 < diff < BF16_FORWARD_TOLERANCE, diff


def test_bench_bf16_times_the_autocast_eager_loop(tmp_path, capsys) -> None:
    import json

    data = tmp_path / "bench.json"
    code = bench.main(["--size", "tiny", "--backend", "numpy", "--configs", "C3", "--cells",
                       "ln_lstm", "--modes", "inference,training", "--peers", "eager",
                       "--precision", "bf16", "--reps", "1", "--warmup", "1",
                       "--no-compile-time", "--json", str(data), "--clock", "cpu"])
    assert code == 0
    rows = json.loads(data.read_text())["rows"]
    assert [(r["mode"], r["peer"], r["precision"]) for r in rows] == [
        (mode, peer, precision) for mode in ("inference", "training") for peer, precision in
        (("eager", "fp32"), ("rnnc-fp32", "bf16"), ("eager-autocast", "bf16"))]
    for r in rows[2::3]:
        assert r["peer_impl"] == "eager loop autocast" and r["rnnc_impl"] == "rnnc.RNN bf16"
        assert math.isfinite(r["peer_ms"]) and r["peer_ms"] > 0 and r["peer_gflops"] > 0
        # rnnc's bf16 keeps layer norm in float32, autocast runs it on the bf16 GEMM output
        assert r["max_abs_diff"] < 2 * BF16_FORWARD_TOLERANCE
    table = capsys.readouterr().out.split("\n\n")[-1]
    assert sum(" eager-autocast " in ln and " bf16 " in ln for ln in table.splitlines()) == 2


@pytest.mark.slow
def test_compiled_autocast_loop_is_the_float32_loop_in_bf16() -> None:
    """torch.compile of the step under autocast (compiling takes tens of seconds)."""
    y32, _ = _eager_forward("ln_lstm")
    y16, label = _eager_forward("ln_lstm", compiled=True, autocast=True)
    assert label == "compiled step loop autocast"
    assert 1e-4 < float((y16 - y32).abs().max()) < BF16_FORWARD_TOLERANCE


@pytest.mark.slow
def test_compiled_peer_never_falls_back_to_eager() -> None:
    """Compiled peers of one cell share torch.compile's graphs on the step's code; each new
    peer starts afresh, so none runs eagerly past the recompile limit."""
    import numpy as np
    import torch
    from torch._dynamo.utils import counters

    from rnnc.tools.bench.peers import torch_eager_call

    spec = bench.CELLS["lstm"]
    with torch._dynamo.config.patch(recompile_limit=1):
        for H in (4, 5):  # a second shape would be a recompile
            config = bench.Config("t", 2, 1, H, H)
            fn, _ = torch_eager_call(spec, config, bench.layer_params(spec, config),
                                     "inference", compiled=True)
            fn(torch.from_numpy(np.ones((2, 1, H), np.float32)))
            assert counters["frames"]["ok"] == counters["frames"]["total"] > 0, H


def test_rnnc_bench_markdown_quotes_its_command(tmp_path, monkeypatch) -> None:
    from rnnc.tools import cli

    markdown = tmp_path / "bench.md"
    words = ["--size", "tiny", "--backend", "numpy", "--configs", "C3", "--cells", "lstm",
             "--modes", "inference", "--peers", "eager", "--reps", "1", "--warmup", "1",
             "--no-compile-time", "--markdown", str(markdown)]
    monkeypatch.setattr("sys.argv", ["rnnc", "bench", *words])
    assert cli.main() == 0
    assert f"Command: `rnnc bench {' '.join(words)}`" in markdown.read_text()
