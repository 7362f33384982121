"""hoist-sequence's rule (b) stacks no sequence wider than it needs (passes/_sink_costs.py): a
sum over feature axes of a carried value stays in the loop, and a layout op of sequences is
made again after the loop rather than stacked. On the selective SSM (a ``(D, N)`` state) no
program of the loop form stacks a ``(T, B, D, N)`` sequence that autodiff did not save; its
gradients against the unoptimized program are in tests/passes/test_row_sums.py, the rule on
every standard cell in tests/passes/test_passes_semantics.py.
"""

from __future__ import annotations

import math

import pytest

import rnnc
from rnnc.names import is_saved
from rnnc.passes import pipeline
from rnnc.passes import run as run_passes
from rnnc.printer import format_program

D, N = 4, 3


@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
def test_selective_ssm_loop_stacks_nothing_of_its_state_size(mode):
    """Only saved values (the training forward's) are as wide as the state: the backward's
    ``(B, D, N)`` products are summed over ``N`` or ``D`` in the loop, the cotangent
    ``d.y`` expanded to ``(B, D, N)`` is expanded again after the loop, and the inference's
    output ``sum(h * C)`` is made in the loop instead of stacking ``h``."""
    program = run_passes(rnnc.cells.selective_ssm(D, N).program(),
                         pipeline(mode, parallel_scan=False))
    body = program.scan.body
    wide = [name for name in program.scan.stacked if not is_saved(name)
            and math.prod(body.node(body.outputs[name]).shape[1:]) >= D * N]
    assert wide == [], format_program(program)
    if mode == "backward":
        assert "d.y" in program.post.args(), format_program(program)
