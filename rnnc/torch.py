"""PyTorch interop: ``rnnc.torch.RNN``, an ``nn.Module`` that runs rnnc inside autograd.

The module has the parameters of ``torch.nn.RNN/LSTM/GRU`` with the same names and shapes
(``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``), so
state dicts load both ways, and it returns what torch returns: ``(output, h_n)`` or, for
LSTM, ``(output, (h_n, c_n))``, with ``PackedSequence`` in and out. Forward and backward
are one ``torch.autograd.Function`` over ``rnnc.RNN.forward``/``backward``, so the module
trains with any torch optimizer and under ``DistributedDataParallel``.

CPU tensors cross into NumPy without copies (``.detach().numpy()`` and
``torch.from_numpy``); tensors on another device are copied through the host, since the
layer computes on host arrays. Only the per-gate split of the fused torch weights copies.

A custom cell factory works too: its parameters are registered as ``{name}_l{k}`` (and
``{name}_l{k}_reverse``) with rnnc's shapes, and ``hx`` and the returned states are dicts
by state name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from rnnc import weights as W
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.layers import RNN as Layer
from rnnc.layers import CellFactory, Grid

_TORCH_MODES = {"RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu", "LSTM": "lstm", "GRU": "gru"}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Return a NumPy view of a CPU tensor (a host copy for other devices), without autograd."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.numpy()


def from_numpy(a: Any, like: torch.Tensor) -> torch.Tensor:
    """Return ``a`` as a tensor on ``like``'s device, sharing memory where it can."""
    if isinstance(a, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(a))
    else:  # a device array (CuPy) from a GPU backend: exchange through DLPack
        t = torch.from_dlpack(a)
    return t if t.device == like.device else t.to(like.device)


class _Apply(torch.autograd.Function):
    """``(x, *states, *params) -> (y, *final_states)`` through rnnc's layer."""

    @staticmethod
    def forward(ctx: Any, module: RNN, lengths: np.ndarray | None, seed: int | None,
                x: torch.Tensor, *tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        names = module.state_names
        states = {n: to_numpy(s) for n, s in zip(names, tensors, strict=False) if s is not None}
        grid = module._rnnc_params(tensors[len(names):])
        rng = None if seed is None else np.random.default_rng(seed)
        y, final, tape = module.layer.forward(to_numpy(x), lengths, states, train=True,
                                              params=grid, rng=rng,
                                              apply_dropout=seed is not None)
        ctx.module, ctx.tape = module, tape
        ctx.given = [s is not None for s in tensors[:len(names)]]
        ctx.like = x
        return (from_numpy(y, x), *(from_numpy(final[n], x) for n in names))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_y: torch.Tensor, *d_final: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        module: RNN = ctx.module
        names = module.state_names
        g = module.layer.backward(ctx.tape, to_numpy(d_y),
                                  {n: to_numpy(d) for n, d in zip(names, d_final, strict=True)})
        like = ctx.like
        d_states = [from_numpy(g.states[n], like) if given else None
                    for n, given in zip(names, ctx.given, strict=True)]
        d_params = [from_numpy(a, like) for a in module._torch_grads(g.params)]
        return (None, None, None, from_numpy(g.x, like), *d_states, *d_params)


class RNN(nn.Module):
    """A drop-in ``torch.nn.RNN/LSTM/GRU`` computed by rnnc.

    ``mode`` is ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"``, ``"gru"`` (or torch's spelling
    ``"LSTM"``, ``"RNN_TANH"``, ...) or an rnnc cell factory. ``backend`` is the rnnc backend
    (``None``: the fastest available); ``backend_options`` go to ``rnnc.compile``. Dropout
    between layers draws from torch's random generator, so ``torch.manual_seed`` fixes it.
    """

    def __init__(self, mode: str | CellFactory, input_size: int, hidden_size: int,
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, backend: str | None = None,
                 device: Any = None, dtype: torch.dtype | None = None, **backend_options: Any
                 ) -> None:
        super().__init__()
        if isinstance(mode, str):
            mode = _TORCH_MODES.get(mode, mode)
        self.layer = Layer(mode, input_size, hidden_size, num_layers=num_layers,
                           bidirectional=bidirectional, dropout=dropout,
                           batch_first=batch_first, backend=backend, seed=0, **backend_options)
        self.mode = mode
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.bidirectional = num_layers, bool(bidirectional)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.proj_size = 0
        self.state_names = tuple(self.layer.state_sizes)
        if not self.bias and not isinstance(mode, str):
            raise RnncValueError("bias=False needs a standard mode; a custom cell declares its "
                                 "own parameters")
        factory = {"device": device, "dtype": dtype}
        self._param_names: list[list[list[str]]] = []
        D = 2 if bidirectional else 1
        for k in range(num_layers):
            row = []
            for d in range(D):
                names = []
                for name, shape in self._shapes(k).items():
                    full = self._torch_name(name, k, d == 1)
                    self.register_parameter(full, nn.Parameter(torch.empty(shape, **factory)))
                    names.append(full)
                row.append(names)
            self._param_names.append(row)
        self.reset_parameters()

    def _shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        """Parameter shapes of layer ``k`` keyed by rnnc name (custom) or torch base name."""
        in_k, H = self.layer.layer_input_size(k), self.hidden_size
        if not isinstance(self.mode, str):
            return {n: a.shape for n, a in self.layer.params[k][0].items()}
        gh = W.num_gates(self.mode) * H
        shapes = {"weight_ih": (gh, in_k), "weight_hh": (gh, H)}
        if self.bias:
            shapes.update({"bias_ih": (gh,), "bias_hh": (gh,)})
        return shapes

    @staticmethod
    def _torch_name(name: str, k: int, reverse: bool) -> str:
        return f"{name}_l{k}" + ("_reverse" if reverse else "")

    def reset_parameters(self) -> None:
        """PyTorch's init: every parameter uniform in ±1/sqrt(hidden_size), from torch's RNG."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self._flat_parameters():
                p.uniform_(-bound, bound)

    def flatten_parameters(self) -> None:
        """Do nothing: kept so code written for ``torch.nn.LSTM`` runs unchanged."""

    def _flat_parameters(self) -> list[nn.Parameter]:
        return [getattr(self, n) for row in self._param_names for names in row for n in names]

    def _rnnc_params(self, tensors: tuple[torch.Tensor, ...]) -> Grid:
        """Convert the parameter tensors (in ``_flat_parameters`` order) to rnnc's grid."""
        grid, pos = [], 0
        for row in self._param_names:
            out_row = []
            for names in row:
                arrays = [to_numpy(t) for t in tensors[pos:pos + len(names)]]
                pos += len(names)
                if isinstance(self.mode, str):
                    w_ih, w_hh, *b = arrays
                    b_ih, b_hh = b if b else (None, None)
                    out_row.append(W.from_torch_layer(self.mode, w_ih, w_hh, b_ih, b_hh))
                else:
                    base = [n.rsplit("_l", 1)[0] for n in names]
                    out_row.append(dict(zip(base, arrays, strict=True)))
            grid.append(out_row)
        return grid

    def _torch_grads(self, grads: Grid) -> list[np.ndarray]:
        """Convert rnnc's gradient grid to arrays in ``_flat_parameters`` order."""
        out: list[np.ndarray] = []
        for row, names_row in zip(grads, self._param_names, strict=True):
            for g, names in zip(row, names_row, strict=True):
                if isinstance(self.mode, str):
                    out.extend(W.to_torch_layer(self.mode, g)[:len(names)])
                else:
                    out.extend(g[n.rsplit("_l", 1)[0]] for n in names)
        return out

    def _states_in(self, hx: Any) -> list[torch.Tensor | None]:
        if hx is None:
            return [None] * len(self.state_names)
        if isinstance(hx, dict):
            return [hx.get(n) for n in self.state_names]
        if isinstance(hx, torch.Tensor):
            hx = (hx,)
        if len(hx) != len(self.state_names):
            raise RnncValueError(f"hx must hold {len(self.state_names)} tensors "
                                 f"({', '.join(self.state_names)}), got {len(hx)}")
        return list(hx)

    def _states_out(self, final: tuple[torch.Tensor, ...]) -> Any:
        if not isinstance(self.mode, str):
            return dict(zip(self.state_names, final, strict=True))
        return final[0] if len(final) == 1 else tuple(final)

    def forward(self, input: torch.Tensor | PackedSequence, hx: Any = None) -> tuple[Any, Any]:
        """Run the layers: ``(output, h_n)`` or ``(output, (h_n, c_n))`` as torch does."""
        packed = isinstance(input, PackedSequence)
        lengths = None
        unbatched = False
        if packed:
            x, lens = pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = lens.numpy()
        else:
            x = input
            if not isinstance(x, torch.Tensor):
                raise RnncTypeError(f"input must be a tensor or a PackedSequence, got "
                                    f"{type(x).__name__}")
            unbatched = x.dim() == 2
            if unbatched:
                x = x.unsqueeze(0 if self.batch_first else 1)
        states = self._states_in(hx)
        if unbatched:
            states = [None if s is None else s.unsqueeze(1) for s in states]
        seed = None
        if self.training and self.dropout > 0 and self.num_layers > 1:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        y, *final = _Apply.apply(self, lengths, seed, x, *states, *self._flat_parameters())
        if unbatched:
            y = y.squeeze(0 if self.batch_first else 1)
            final = [f.squeeze(1) for f in final]
        if packed:
            y = self._repack(y, lens, input)
        return y, self._states_out(tuple(final))

    def _repack(self, y: torch.Tensor, lens: torch.Tensor, like: PackedSequence
                ) -> PackedSequence:
        """Pack ``y`` (original batch order) with the batch sizes and order of ``like``."""
        if like.sorted_indices is not None:
            dim = 0 if self.batch_first else 1
            y = y.index_select(dim, like.sorted_indices.to(y.device))
            lens = lens[like.sorted_indices.cpu()]
        data = pack_padded_sequence(y, lens, batch_first=self.batch_first,
                                    enforce_sorted=True).data
        return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)

    def extra_repr(self) -> str:
        mode = self.mode if isinstance(self.mode, str) else getattr(self.mode, "__name__", "cell")
        return (f"{mode!r}, {self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"bias={self.bias}, batch_first={self.batch_first}, dropout={self.dropout}, "
                f"bidirectional={self.bidirectional}, backend={self.layer.backend!r}")


__all__ = ["RNN", "from_numpy", "to_numpy"]
