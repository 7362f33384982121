"""Save plans: which values a training forward stacks for its backward (``save.N``), recorded
by each autodiff pass in ``Program.saves`` and checked before a backend builds a program that
reads or writes them.

A plan is the saved values of one autodiff (``rnnc.ir.SavePlan``): the training forward
(autodiff-forward) stacks exactly these, and the backward (autodiff-backward on the same
program) reads exactly these, so both programs carry the same plan.
"""

from __future__ import annotations

from rnnc.ir import Program
from rnnc.names import Role


def check_save_plans(writer: Program, writer_mode: str, reader: Program, reader_mode: str,
                     level: int) -> None:
    """Raise RuntimeError unless ``writer`` stacks exactly the values ``reader`` reads: the
    save plans of their first ``level`` autodiff passes agree, the writer returns each saved
    value with its planned type, and (where ``level`` is the reader's last autodiff) the reader
    takes each one as a saved arg of that type."""
    ours, theirs = writer.saves[:level], reader.saves[:level]
    fault = None
    if len(ours) < level or ours != theirs:
        fault = f"the save plans differ: {_plans_text(ours)} against {_plans_text(theirs)}"
    else:
        stacked = writer.env_types()
        for name, ty in ours[-1]:
            if name not in writer.results or stacked.get(name) != ty:
                fault = f"{writer_mode!r} does not return {name} as {ty}"
            elif level == len(reader.saves) and reader.args.get(name) != (Role.SAVED, ty):
                fault = f"{reader_mode!r} does not read {name} as a saved {ty}"
            if fault:
                break
    if fault:
        raise RuntimeError(f"rnnc internal error: {reader_mode!r} must read what {writer_mode!r} "
                           f"saves, but {fault}. Please report this with the cell's code.")


def _plans_text(plans: tuple) -> str:
    return "; ".join(", ".join(f"{n}: {t}" for n, t in plan) for plan in plans) or "none"
