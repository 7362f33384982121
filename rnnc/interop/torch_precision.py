"""``rnnc.torch.RNN`` in bfloat16: a module moved with ``.to(torch.bfloat16)``, or a float32
module called under ``torch.autocast(device, dtype=torch.bfloat16)``.

Either call runs the layer compiled with ``precision="bf16"`` (:mod:`rnnc.precision`):
bfloat16 GEMM operands, float32 sums, elementwise math, states and tape in float32.

- ``.to(torch.bfloat16)``: the parameters are stored in bfloat16 (they are the GEMM operands
  already, so nothing is lost), the input and states must be bfloat16 as torch requires, and
  the outputs and final states come back in bfloat16, as ``nn.LSTM`` returns them. Gradients
  reach the parameters in bfloat16.
- ``torch.autocast``: the module stays float32 (fp32 master weights, fp32 gradients), the
  input may be float32 or bfloat16, and the outputs and final states are float32: they are
  the results of float32 elementwise math, and the next autocast op casts them as it needs.

A module built with ``precision="bf16"`` runs in bfloat16 on every call, float32 data in,
float32 out. Autocast in float16 leaves the module in float32 (rnnc has no float16 GEMMs).
"""

from __future__ import annotations

from typing import Any

import torch

from rnnc.errors import RnncValueError


def _autocast_bf16(x: torch.Tensor) -> bool:
    device = x.device.type
    return torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == \
        torch.bfloat16


def call_precision(module: Any, x: torch.Tensor) -> tuple[str, torch.dtype | None]:
    """The precision of a call of ``module`` on ``x``, and the dtype its results are cast to
    (None: float32 as computed). Sets the layer to that precision."""
    params = module._flat_parameters()
    built = module.built_precision
    if params and params[0].dtype == torch.bfloat16:
        if x.dtype != torch.bfloat16 and not _autocast_bf16(x):
            raise RnncValueError(f"input dtype ({x.dtype}) does not match weight dtype "
                                 f"(torch.bfloat16). Convert input: input.to(torch.bfloat16), "
                                 f"or convert model: model.to({x.dtype})")
        precision, out = "bf16", torch.bfloat16
    elif x.dtype != torch.float64 and _autocast_bf16(x):
        precision, out = "bf16", None
    else:
        precision, out = built, None
    options = module.layer.backend_options
    if options.get("precision", "fp32") != precision:  # written only on a change: under
        options["precision"] = precision  # torch.compile a write is a side effect to guard
    return precision, out


def widen(t: Any) -> Any:
    """A bfloat16 tensor as float32 (differentiable: gradients come back in bfloat16)."""
    return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t
