"""A cell on which LLVM 22's loop peeling aborted the process (found by the slow fuzz, seed 4469).

Compiling its backward program made LLVM assert in ``LoopPeel.cpp`` ("when peeling the last
iteration, the loop must be supported ..."), which kills the process, so the check runs in a
child process: an abort fails this test instead of the test session. ``backends/llvm/cache.py``
caps loop peeling at 0 iterations; the cell must then compile and agree with the oracle in its
fuzz combination (the inference, training and masked pipelines the fuzzer runs).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = """
from tests.fuzz.campaign import case
from tests.fuzz.differential import COMBOS, TARGETS, Stats, check
seed = 4469
c = case(seed)
stats = Stats()
found = check(c.spec, c.T, c.B, c.seed, TARGETS["llvm"], (COMBOS[seed % len(COMBOS)],), stats)
assert not found, [f.describe() for f in found]
assert stats.comparisons > 0, stats
print("agrees", stats.comparisons)
"""


def test_the_cell_that_made_llvm_abort_compiles_and_agrees(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "RNNC_CACHE_DIR": str(tmp_path), "RNNC_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "agrees" in proc.stdout
