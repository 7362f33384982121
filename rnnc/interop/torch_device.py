"""The tensor <-> array bridge of ``rnnc.torch.RNN``: host NumPy views, or device arrays.

Each call of the module picks a bridge from where its input is (:func:`bridge`):

- :class:`HostBridge` for CPU tensors: NumPy views without copies (``.detach().numpy()``) in,
  ``torch.from_numpy`` out. A tensor on a GPU given to a module whose rnnc backend runs on the
  host ("numpy", "llvm", or "cuda" with ``emulate=True``) is copied through the host both ways.
- :class:`DeviceBridge` for a CUDA tensor with ``backend="cuda"`` on a GPU: rnnc's device reads
  every tensor in place through ``__cuda_array_interface__`` (no copy, no ``.cpu()``), the layer
  runs as a device call (``docs/device-calls.md``), and its CuPy results become CUDA tensors
  through DLPack. PyTorch's fused weights are cut into rnnc's per-gate blocks by torch on the
  GPU (:func:`split_gates`) and the gradients joined back the same way (:func:`join_gates`).
  The call runs on torch's current CUDA stream (CuPy is told of it as an external stream), so
  it is ordered after the work that made its inputs and before the work that reads its results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from rnnc.interop.cell_params import (
    gates,
    hidden_bias_names,
    hidden_weight_names,
    input_bias_names,
    input_weight_names,
)
from rnnc.interop.torch_hooks import TorchRNN

_FUSED = (("W_i", "weight_ih"), ("W_h", "weight_hh"), ("b_i", "bias_ih"), ("b_h", "bias_hh"))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Return a NumPy view of a CPU tensor (a host copy for other devices), without autograd."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.numpy()


def from_numpy(a: Any, like: torch.Tensor) -> torch.Tensor:
    """Return ``a`` as a tensor on ``like``'s device, sharing memory where it can.

    A read-only array (one rnnc saved for backward) is copied: a tensor is always writable,
    and a write through it would change what backward reads."""
    if isinstance(a, np.ndarray):
        t = torch.from_numpy(np.array(a, order="C") if not a.flags.writeable
                             else np.ascontiguousarray(a))
    else:  # a device array (CuPy) from a GPU backend: exchange through DLPack
        t = torch.from_dlpack(a)
    return t if t.device == like.device else t.to(like.device)


def unshared(xp: Any, a: Any, held: Iterable[Any]) -> Any:
    """``a``, or a copy of it where it may share memory with an array of ``held`` (those of
    the array module ``xp``, NumPy or CuPy; others live elsewhere).

    A module's results become tensors the caller may change in place, as ``nn.LSTM``'s may
    be: one sharing memory with what backward reads (the tape's saved values, the inputs)
    would silently change its gradients, or the caller's input. A bounds check, so cheap;
    a false alarm costs one copy."""
    if any(isinstance(h, xp.ndarray) and xp.may_share_memory(a, h) for h in held):
        return a.copy()
    return a


def split_gates(mode: str, fused: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """Cut one pseudo-layer's fused torch weights (by base name: ``weight_ih``, ``weight_hh``,
    ``bias_ih``, ``bias_hh``, ``weight_hr``; a missing bias is zeros) into rnnc's per-gate
    parameters, with torch operations on the tensors' own device: the same values as
    ``rnnc.interop.weights.from_torch_layer``, which works on host arrays."""
    names = gates(mode)
    w_hh = fused["weight_hh"].detach()
    H = w_hh.shape[0] // len(names)
    out: dict[str, torch.Tensor] = {}
    for prefix, base in _FUSED:
        block = fused.get(base)
        block = torch.zeros(len(names) * H, dtype=w_hh.dtype, device=w_hh.device) \
            if block is None else block.detach()
        for j, gate in enumerate(names):
            part = block[j * H:(j + 1) * H]
            out[f"{prefix}{gate}"] = (part.T if part.dim() == 2 else part).contiguous()
    if mode == "lstm" and fused.get("weight_hr") is not None:
        out["W_hr"] = fused["weight_hr"].detach().T.contiguous()
    return out


def join_gates(mode: str, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """rnnc's per-gate parameters (or gradients) of one pseudo-layer as torch's fused
    ``(weight_ih, weight_hh, bias_ih, bias_hh)``, and ``weight_hr`` fifth with ``W_hr``: the
    inverse of :func:`split_gates`, on the tensors' own device."""
    fused = (torch.cat([params[n].T for n in input_weight_names(mode)], 0),
             torch.cat([params[n].T for n in hidden_weight_names(mode)], 0),
             torch.cat([params[n] for n in input_bias_names(mode)]),
             torch.cat([params[n] for n in hidden_bias_names(mode)]))
    # GRU's reset gate has a W_hr too; only in an LSTM is it the projection
    w_hr = (params["W_hr"].T,) if mode == "lstm" and "W_hr" in params else ()
    return tuple(t.contiguous() for t in (*fused, *w_hr))


class HostBridge:
    """Tensors as host arrays: NumPy views of CPU tensors, host copies of the others."""

    def array(self, t: torch.Tensor, what: str) -> np.ndarray:
        """``t`` as a NumPy array."""
        return to_numpy(t)

    def tensor(self, a: Any, like: torch.Tensor) -> torch.Tensor:
        """The result ``a`` as a tensor on ``like``'s device."""
        return from_numpy(a, like)

    def output(self, a: np.ndarray, like: torch.Tensor, held: Iterable[Any]) -> torch.Tensor:
        """The result ``a`` as a tensor of its own, sharing no memory with ``held``."""
        return from_numpy(unshared(np, a, held), like)

    def params(self, module: TorchRNN, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The module's parameter tensors as rnnc's ``[layer][direction]`` grid."""
        return module._rnnc_params(tensors)

    def grads(self, module: TorchRNN, grid: Any, like: torch.Tensor) -> list[torch.Tensor]:
        """rnnc's gradient grid as tensors in ``_flat_parameters`` order."""
        return [from_numpy(a, like) for a in module._torch_grads(grid)]

    def context(self) -> contextlib.AbstractContextManager[None]:
        """Where the call runs: nothing to set up on the host."""
        return contextlib.nullcontext()


class DeviceBridge:
    """CUDA tensors as device arrays of ``device`` (rnnc's CUDA backend on a GPU), in place."""

    def __init__(self, device: Any, where: torch.device) -> None:
        self.device, self.where = device, where

    def array(self, t: torch.Tensor, what: str) -> Any:
        """``t`` read in place as a CuPy array (``__cuda_array_interface__``)."""
        return self.device.adopt(t.detach(), what)

    def tensor(self, a: Any, like: torch.Tensor) -> torch.Tensor:
        """The device array ``a`` as a CUDA tensor, through DLPack (no copy)."""
        t = torch.from_dlpack(a)
        return t if t.device == like.device else t.to(like.device)

    def output(self, a: Any, like: torch.Tensor, held: Iterable[Any]) -> torch.Tensor:
        """The result ``a`` as a CUDA tensor of its own, sharing no memory with ``held``."""
        return self.tensor(unshared(self.device.xp, a, held), like)

    def params(self, module: TorchRNN, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The module's parameter tensors as a grid of device arrays, split on the GPU."""
        grid, pos = [], 0
        for row in module._param_names:
            out_row = []
            for names in row:
                by_base = {_base_name(n): t for n, t in
                           zip(names, tensors[pos:pos + len(names)], strict=True)}
                pos += len(names)
                if isinstance(module.mode, str):
                    by_base = split_gates(module.mode, by_base)
                out_row.append({n: self.array(t, f"parameter {n!r}")
                                for n, t in by_base.items()})
            grid.append(out_row)
        return grid

    def grads(self, module: TorchRNN, grid: Any, like: torch.Tensor) -> list[torch.Tensor]:
        """rnnc's gradient grid (device arrays) as CUDA tensors in ``_flat_parameters``
        order, fused on the GPU."""
        out: list[torch.Tensor] = []
        for row, names_row in zip(grid, module._param_names, strict=True):
            for g, names in zip(row, names_row, strict=True):
                tensors = {n: self.tensor(a, like) for n, a in g.items()}
                if isinstance(module.mode, str):
                    fused = join_gates(module.mode, tensors)
                    tensors = dict(zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh",
                                        "weight_hr"), fused, strict=False))
                out.extend(tensors[_base_name(n)] for n in names)
        return out

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Run on the tensors' GPU and on torch's current stream there."""
        import cupy

        stream = torch.cuda.current_stream(self.where)
        with cupy.cuda.Device(self.where.index), cupy.cuda.ExternalStream(stream.cuda_stream):
            yield


def _base_name(name: str) -> str:
    """``weight_ih_l1_reverse`` -> ``weight_ih``: a parameter's name without layer suffix."""
    return name.rsplit("_l", 1)[0]


def bridge(module: TorchRNN, t: torch.Tensor) -> HostBridge | DeviceBridge:
    """The bridge of a call whose input (or output gradient) is ``t``: the device one for a
    CUDA tensor when the module's rnnc backend has a GPU device, else the host one."""
    device = getattr(module.layer.function(0).backend, "device", None)
    if t.device.type == "cuda" and device is not None and not device.emulate:
        return DeviceBridge(device, t.device)
    return HostBridge()
