"""The README's code is a promise: its Python example runs and its two commands are the CI's."""

from __future__ import annotations

import pathlib
import re

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()


def test_own_cell_example_runs(capsys) -> None:
    section = README[README.index("## Your own cell"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "(32, 64) (20, 8, 32) (8, 64)" in out
    assert "scan forward" in out


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second() -> None:
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["pip install -e . && rnnc demo",
                        "pip install -e '.[test,torch]' && pytest"]
    ci = (pathlib.Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_optimized_lstm_ir_in_readme_is_current() -> None:
    import rnnc

    section = README[README.index("## How rnnc optimizes a cell"):README.index("## Backends")]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    fn = rnnc.compile(rnnc.cells.lstm(3, 4))
    assert blocks[1].strip() == fn.ir().strip()
    assert blocks[2].strip() == fn.ir("backward").strip()
