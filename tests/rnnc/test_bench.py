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
