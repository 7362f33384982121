"""The docstrings of the DSL functions ``rnnc.dsl`` generates from the op registry, by op name.

An op without an entry gets a one-line default naming its kind."""

from __future__ import annotations

from rnnc.ops_elementwise import FAMILY

DOCS: dict[str, str] = {
    "where": "``a`` where ``cond > 0``, else ``b`` (elementwise, broadcasting).",
    "concat": "Concatenate a list of values along the feature axis.",
    "mean": "Mean over the feature axis, kept as an axis of 1: ``(B, n) -> (B, 1)``.",
    "sum": "Sum over the feature axis, kept as an axis of 1: ``(B, n) -> (B, 1)``.",
    "amax": "Maximum over the feature axis, kept as an axis of 1: ``(B, n) -> (B, 1)``; its "
            "gradient is shared evenly by the elements equal to the maximum.",
    "amin": "Minimum over the feature axis, kept as an axis of 1: ``(B, n) -> (B, 1)``; its "
            "gradient is shared evenly by the elements equal to the minimum.",
    "softplus": "``log(1 + exp(x))``, computed without overflow; its gradient is sigmoid(x).",
    "stop_gradient": "``x`` itself, with no gradient: autodiff treats it as a constant.",
}
# The elementwise family documents its ops where it declares them.
DOCS.update({member.op.name: member.doc for member in FAMILY})
