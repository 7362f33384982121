"""The Markdown page of ``benchmarks/gpu_check.py``'s results (the JSON file holds the same)."""

from __future__ import annotations

from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def _flashrnn(part: dict[str, Any]) -> list[str]:
    """The flashrnn part's rows: rnnc's device call beside each FlashRNN backend."""
    if not part.get("rows") and not part.get("errors"):
        return []
    lines = ["", "## FlashRNN (ms; ratio = rnnc device / FlashRNN, lower is better)", "",
             "Backends: " + ", ".join(part.get("backends", [])) + ". The last column is the "
             "largest difference of FlashRNN's y from rnnc's on the same input.", ""]
    lines += _table(["config", "cell", "mode", "contestant", "median (min-max)", "ratio",
                     "max abs diff y", "first call ms"],
                    [[r["config"], r["cell"], r["mode"], r["contestant"],
                      f"{_ms(r['median_ms'])} ({_ms(r['min_ms'])}-{_ms(r['max_ms'])})",
                      "" if r["ratio"] is None else f"{r['ratio']:.2f}",
                      "" if r["max_abs_diff_y"] is None else f"{r['max_abs_diff_y']:.1e}",
                      _ms(r.get("first_call_ms"))]
                     for r in part.get("rows", [])])
    return lines + [f"- error: {error}" for error in part.get("errors", [])]


def to_markdown(data: dict[str, Any]) -> str:
    """Every part's status, results and skips, as one page."""
    env = data.get("environment", {})
    where = "emulated on the CPU (times mean nothing)" if data["emulate"] else \
        env.get("device") or "a GPU"
    lines = [f"# rnnc GPU check: {where}", "",
             f"{data['date']}; size {data['size']}; {data.get('seconds', 0):.0f} s of a "
             f"{data['minutes']} min limit.", ""]
    if data.get("stopped_by_watchdog"):
        lines += [f"**Stopped by the watchdog** {data['stopped_by_watchdog']}: what follows "
                  "is what had been measured.", ""]
    lines += ["## Environment", ""]
    lines += _table(["what", "value"], [[k, v] for k, v in env.items() if k != "found"]
                    + [["installed", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in
                                               env.get("found", {}).items())]])
    parts = data["parts"]
    lines += ["## Parts", ""]
    lines += _table(["part", "status", "seconds", "budget s", "skipped"],
                    [[name, p["status"], f"{p.get('seconds', 0):.1f}", f"{p['budget_s']:.1f}",
                      len(p["skipped"])] for name, p in parts.items()])
    tests = parts.get("tests", {})
    if tests.get("summary") is not None:
        lines += ["## Tests (`-m cuda`)", "", f"`{tests.get('command', '')}`", "",
                  f"Summary: {tests['summary'] or '(none: see the tail)'}", ""]
        lines += [f"- {line}" for line in tests.get("failures", [])]
        lines += ["", "```", *tests.get("tail", []), "```", ""]
    bench = parts.get("bench", {})
    if bench.get("rows"):
        lines += ["## Benchmarks (ms; ratio = rnnc device / contestant, lower is better)", ""]
        lines += _table(["config", "cell", "mode", "contestant", "median (min-max)", "ratio"],
                        [[r["config"], r["cell"], r["mode"], r["contestant"],
                          f"{_ms(r['median_ms'])} ({_ms(r['min_ms'])}-{_ms(r['max_ms'])})",
                          "" if r["ratio"] is None else f"{r['ratio']:.2f}"]
                         for r in bench["rows"]])
    if bench.get("paths"):
        lines += ["## Launch paths chosen by `fused_step=\"auto\"` (rnnc device rows)", ""]
        lines += _table(
            ["config", "cell", "mode", "program", "T", "B", "path", "chosen by", "graph",
             "tuning s", "first call ms", "steady ms", "timed (ms)", "dropped"],
            [[p["config"], p["cell"], p["mode"], p["program"], p["T"], p["B"], p["path"],
              p["chosen_by"], "yes" if p["graph"] else
              (f"capture failed: {p.get('capture_error') or '?'}" if p["capture_failed"]
               else "no"), f"{p['tuning_s']:.3f}",
              _ms(p["first_call_ms"]), _ms(p["steady_ms"]),
              ", ".join(f"{k} {_ms(v)}" for k, v in p["times_ms"].items()),
              "; ".join(f"{k}: {v}" for k, v in p["dropped"].items())]
             for p in bench["paths"]])
    for error in bench.get("errors", []):
        lines.append(f"- error: {error}")
    profile = parts.get("profile", {})
    if profile.get("rows"):
        lines += ["", f"## Profile: {profile['call']} ({profile['timer']})", ""]
        lines += _table(["what", "host ms", "GPU ms"],
                        [[name, _ms(r["host_ms"]), _ms(r["gpu_ms"])]
                         for name, r in profile["rows"].items()])
    lines += _flashrnn(parts.get("flashrnn", {}))
    skipped = [(name, item) for name, p in parts.items() for item in p["skipped"]]
    lines += ["## Skipped", ""]
    lines += [f"- {name}: {item}" for name, item in skipped] or ["- nothing"]
    return "\n".join(lines) + "\n"
