"""PyTorch interop: ``rnnc.torch.RNN``, an ``nn.Module`` that runs rnnc inside autograd.

The module has the parameters of ``torch.nn.RNN/LSTM/GRU`` with the same names and shapes
(``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``), so
state dicts load both ways, and it returns what torch returns: ``(output, h_n)`` or, for
LSTM, ``(output, (h_n, c_n))``, with ``PackedSequence`` in and out. Forward and backward
are one ``torch.autograd.Function`` over ``rnnc.RNN.forward``/``backward``, so the module
trains with any torch optimizer and under ``DistributedDataParallel``.

CPU tensors cross into NumPy without copies (``.detach().numpy()`` and
``torch.from_numpy``). CUDA tensors with ``backend="cuda"`` on a GPU stay on the GPU: rnnc
reads them in place and returns CUDA tensors through DLPack, forward and backward
(``rnnc.interop.torch_device``); with a host backend they are copied through the host. Only
the per-gate split of the fused torch weights copies (on the tensors' device).

A custom cell factory works too: its parameters are registered as ``{name}_l{k}`` (and
``{name}_l{k}_reverse``) with rnnc's shapes and start from the cell's own initializers
(``c.param(..., init=...)``) seeded from torch's generator, and ``hx`` and the returned states
are dicts by state name, ``(L*D, B, *shape)`` for a state of feature shape ``shape``. A cell
with extra inputs (every input after the first, see ``rnnc.RNN``) takes them as
``module(x, hx, extra={"u": u})``, tensors laid out like the (padded) input, and they get
gradients through autograd like ``x``, under ``torch.compile`` too.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from rnnc.errors import RnncRuntimeError, RnncTypeError, RnncValueError
from rnnc.interop import torch_autograd, torch_ops, torch_precision
from rnnc.interop import weights as W
from rnnc.interop.torch_autograd import from_numpy, to_numpy
from rnnc.interop.torch_checks import (
    DTYPES,
    check_arguments,
    check_dtypes,
    check_input_dtype,
    torch_dtype,
)
from rnnc.layers import RNN as Layer
from rnnc.layers import CellFactory, Grid, check_dropout, check_picklable
from rnnc.layers.checks import SINGLE_LAYER_DROPOUT

_TORCH_BASE_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")


def _base_name(name: str) -> str:
    """``weight_ih_l1_reverse`` -> ``weight_ih``: a parameter's name without layer suffix."""
    return name.rsplit("_l", 1)[0]


class RNN(nn.Module):
    """A drop-in ``torch.nn.RNN/LSTM/GRU`` computed by rnnc.

    ``mode`` is ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"``, ``"gru"`` (or torch's spelling
    ``"LSTM"``, ``"RNN_TANH"``, ...) or an rnnc cell factory. ``backend`` is the rnnc backend
    (``None``, the default: llvm where it works here, else numpy, as in ``rnnc.compile``; CUDA
    tensors are then copied through the host, and stay on the GPU with ``backend="cuda"``);
    ``backend_options`` go to ``rnnc.compile``. Dropout
    between layers draws from torch's random generator, so ``torch.manual_seed`` fixes it, and
    so does a cell that draws its own masks (``rnnc.bernoulli``): each forward draws its seed,
    eagerly or under ``torch.compile`` (where inductor draws it with its own generator, also
    seeded by ``torch.manual_seed``, unless its ``fallback_random`` is set).
    """

    def __init__(self, mode: str | CellFactory, input_size: int, hidden_size: int,
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 backend: str | None = None, device: Any = None,
                 dtype: torch.dtype | None = None, *, nonlinearity: str | None = None,
                 extra_inputs: str = "all", **backend_options: Any) -> None:
        super().__init__()
        mode = check_arguments(mode, nonlinearity, input_size, hidden_size, num_layers, bias,
                                batch_first, dropout, proj_size)
        with warnings.catch_warnings():  # said once above, where torch says it
            warnings.filterwarnings("ignore", SINGLE_LAYER_DROPOUT.split(",")[0])
            self.layer = Layer(mode, input_size, hidden_size, num_layers=num_layers,
                               bidirectional=bidirectional, dropout=dropout,
                               batch_first=batch_first, backend=backend, seed=0,
                               proj_size=proj_size, extra_inputs=extra_inputs,
                               # what a cell without parameters computes in (else the weights')
                               dtype=np.float64 if dtype == torch.float64 else np.float32,
                               **backend_options)
        self.mode = mode
        self.built_precision = backend_options.get("precision", "fp32")  # torch_precision
        if mode in ("rnn_tanh", "rnn_relu"):
            self.nonlinearity = mode[4:]
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.bidirectional = num_layers, bool(bidirectional)
        self.bias, self.batch_first = bias, batch_first
        self.proj_size = proj_size
        self.state_names = tuple(self.layer.state_sizes)
        self.extra_names = tuple(self.layer.extra_sizes)
        self.draws_masks = self.layer.draws_masks  # rnnc.bernoulli in the cell
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
        self._op_key = torch_ops.register(self)  # for torch.compile: see torch_ops
        self.reset_parameters()

    def _shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        """Parameter shapes of layer ``k`` keyed by rnnc name (custom) or torch base name."""
        in_k, H = self.layer.layer_input_size(k), self.hidden_size
        if not isinstance(self.mode, str):
            return {n: a.shape for n, a in self.layer.params[k][0].items()}
        gh, P = W.num_gates(self.mode) * H, self.proj_size
        shapes = {"weight_ih": (gh, in_k), "weight_hh": (gh, P or H)}
        if self.bias:
            shapes.update({"bias_ih": (gh,), "bias_hh": (gh,)})
        if P:
            shapes["weight_hr"] = (P, H)
        return shapes

    @property
    def dropout(self) -> float:
        """Dropout between layers; assigning it takes effect at the next forward, as in torch."""
        return self.layer.dropout

    @dropout.setter
    def dropout(self, value: float) -> None:
        self.layer.dropout = check_dropout(value)
        self._op_key = torch_ops.register(self)  # the dropout is part of the op's key

    @property
    def _flat_weights_names(self) -> list[str]:
        return [n for row in self._param_names for names in row for n in names]

    @property
    def _flat_weights(self) -> list[nn.Parameter]:
        return self._flat_parameters()

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """The parameters of each pseudo-layer (layer, direction), as torch's ``all_weights``."""
        return [[getattr(self, n) for n in names] for row in self._param_names for names in row]

    def __getstate__(self) -> dict[str, Any]:
        check_picklable(self.mode)  # fail here, naming the fix, not deep inside pickle
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "draws_masks" not in self.__dict__:  # pickled before modules kept it
            self.draws_masks = self.layer.draws_masks
        self._op_key = torch_ops.register(self)  # a copy is one more live module of its key

    def __deepcopy__(self, memo: dict[int, Any]) -> RNN:
        """A deep copy needs no pickling, so any cell factory (even a lambda) is fine."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(nn.Module.__getstate__(self), memo))
        return new

    @staticmethod
    def _torch_name(name: str, k: int, reverse: bool) -> str:
        return f"{name}_l{k}" + ("_reverse" if reverse else "")

    def reset_parameters(self) -> None:
        """Initialize the parameters from torch's random generator (``torch.manual_seed``).

        The standard modes take PyTorch's init, every parameter uniform in
        ±1/sqrt(hidden_size), as ``torch.nn.LSTM`` does. A custom cell keeps its own
        initializers (``c.param(..., init=...)``, as ``rnnc.RNN`` and ``Cell.init_params`` do),
        run from a seed drawn from torch's generator.
        """
        with torch.no_grad():
            if isinstance(self.mode, str):
                bound = 1.0 / math.sqrt(self.hidden_size)
                for p in self._flat_parameters():
                    p.uniform_(-bound, bound)
                return
            seed = int(torch.randint(0, 2**62, (1,)).item())
            grid = self.layer.init_params(seed, dtype=np.float64)
            for row, names_row in zip(grid, self._param_names, strict=True):
                for arrays, names in zip(row, names_row, strict=True):
                    for name in names:
                        p = getattr(self, name)
                        p.copy_(torch.from_numpy(arrays[_base_name(name)]))

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
                by_base = dict(zip(map(_base_name, names), arrays, strict=True))
                if isinstance(self.mode, str):
                    out_row.append(W.from_torch_layer(
                        self.mode, by_base["weight_ih"], by_base["weight_hh"],
                        by_base.get("bias_ih"), by_base.get("bias_hh"),
                        weight_hr=by_base.get("weight_hr")))
                else:
                    out_row.append(by_base)
            grid.append(out_row)
        return grid

    def _torch_grads(self, grads: Grid) -> list[np.ndarray]:
        """Convert rnnc's gradient grid to arrays in ``_flat_parameters`` order."""
        out: list[np.ndarray] = []
        for row, names_row in zip(grads, self._param_names, strict=True):
            for g, names in zip(row, names_row, strict=True):
                if isinstance(self.mode, str):  # 5 arrays with projections, else 4
                    g = dict(zip(_TORCH_BASE_NAMES, W.to_torch_layer(self.mode, g),
                                 strict=False))
                out.extend(g[_base_name(n)] for n in names)
        return out

    def _states_in(self, hx: Any) -> list[torch.Tensor | None]:
        if hx is None:
            return [None] * len(self.state_names)
        if isinstance(hx, dict):
            unknown = [n for n in hx if n not in self.state_names]
            if unknown:
                raise RnncValueError(f"hx has unknown state {unknown[0]!r}; the cell's states "
                                     f"are {list(self.state_names)}")
            return [hx.get(n) for n in self.state_names]
        if isinstance(hx, torch.Tensor):
            hx = (hx,)
        if len(hx) != len(self.state_names):
            raise RnncValueError(f"hx must hold {len(self.state_names)} tensors "
                                 f"({', '.join(self.state_names)}), got {len(hx)}")
        return list(hx)

    def _check_input(self, x: torch.Tensor) -> None:
        """Raise what torch raises for a bad input (same error kinds, rnnc's classes)."""
        name = self.mode.upper() if isinstance(self.mode, str) else "RNN"
        if x.dim() not in (2, 3):
            raise RnncValueError(f"{name}: Expected input to be 2D or 3D, got {x.dim()}D instead")
        params = self._flat_parameters()  # a custom cell may have none: then the layer's
        dtype = params[0].dtype if params else torch_dtype(self.layer.dtype)
        dtype = torch.float32 if dtype == torch.bfloat16 else dtype  # a bf16 call: float32 x
        check_dtypes(name, dtype, x.dtype)
        check_input_dtype(name, dtype, x.dtype, has_params=bool(params))
        if x.shape[-1] != self.input_size:
            raise RnncRuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                                   f"{self.input_size}, got {x.shape[-1]}")
        if x.shape[1 if self.batch_first and x.dim() == 3 else 0] == 0:
            raise RnncRuntimeError(f"Expected sequence length to be larger than 0 in RNN, got "
                                   f"input of shape {tuple(x.shape)}")

    def _check_states(self, states: list[torch.Tensor | None], B: int, dtype: torch.dtype,
                      unbatched: bool) -> None:
        """Each given state must be ``(L*D, B, *shape)`` (``(L*D, *shape)`` unbatched), like
        torch's ``(L*D, B, size)``; ``shape`` is the state's feature shape in the cell."""
        LD = self.num_layers * (2 if self.bidirectional else 1)
        for i, (name, s) in enumerate(zip(self.state_names, states, strict=True)):
            if s is None:
                continue
            if not isinstance(s, torch.Tensor):
                raise RnncTypeError(f"hx[{i}] ({name}) must be a tensor, got {type(s).__name__}")
            shape = self.layer.state_shapes[name]
            want = (LD, *shape) if unbatched else (LD, B, *shape)
            if s.dim() != len(want):
                kind = "unbatched 2-D" if unbatched else "batched 3-D"
                also = "also " if len(shape) == 1 else ""  # a shaped state has more dims than x
                raise RnncRuntimeError(f"For {kind} input, hx[{i}] ({name}) should {also}be "
                                       f"{len(want)}-D but got a {s.dim()}-D tensor")
            if tuple(s.shape) != want:
                shaped = "" if len(shape) == 1 else \
                    f" (state {name!r}, of feature shape {shape} in the cell)"
                raise RnncRuntimeError(f"Expected hidden[{i}] size {want}, got "
                                       f"{list(s.shape)}{shaped}")
            if s.dtype != dtype:
                raise RnncRuntimeError(f"hx[{i}] ({name}) is {s.dtype}, the input is {dtype}")

    def _states_out(self, final: tuple[torch.Tensor, ...]) -> Any:
        if not isinstance(self.mode, str):
            return dict(zip(self.state_names, final, strict=True))
        return final[0] if len(final) == 1 else tuple(final)

    def _extras_in(self, extra: Any, unbatched: bool, dtype: torch.dtype) -> list[torch.Tensor]:
        """The extra inputs' tensors in the cell's order, as batched as ``x`` is (of dtype
        ``dtype``); their shapes and dtypes are checked by ``rnnc.RNN`` before anything runs,
        all but a dtype NumPy lacks (bfloat16), checked here."""
        extra = {} if extra is None else extra
        if not isinstance(extra, dict):
            raise RnncTypeError(f"extra must be a dict by input name ({list(self.extra_names)}),"
                                f" got {type(extra).__name__}")
        for name in [*(n for n in extra if n not in self.extra_names),
                     *(n for n in self.extra_names if n not in extra)]:
            what = "unknown" if name in extra else "missing"
            raise RnncValueError(f"{what} extra input {name!r}; the cell's extra inputs are "
                                 f"{list(self.extra_names)}")
        out = []
        for name in self.extra_names:
            e = extra[name]
            if isinstance(e, PackedSequence):
                e = pad_packed_sequence(e, batch_first=self.batch_first)[0]
            if not isinstance(e, torch.Tensor):
                raise RnncTypeError(f"extra input {name!r} must be a tensor, got "
                                    f"{type(e).__name__}")
            if e.dtype not in DTYPES:  # checked here: a bfloat16 tensor has no NumPy view
                raise RnncTypeError(f"extra input {name!r} is {e.dtype}, but rnnc.torch.RNN "
                                    f"computes in torch.float32 or torch.float64: pass it as "
                                    f".to({dtype}), the input's dtype")
            out.append(e.unsqueeze(0 if self.batch_first else 1) if unbatched else e)
        return out

    def forward(self, input: torch.Tensor | PackedSequence, hx: Any = None, *,
                extra: dict[str, Any] | None = None) -> tuple[Any, Any]:
        """Run the layers: ``(output, h_n)`` or ``(output, (h_n, c_n))`` as torch does.

        For a custom cell, ``hx`` is a tuple in the order of the cell's ``c.state`` calls or a
        dict by state name, and the final states come back as a dict by name. ``extra`` holds
        the cell's extra inputs by name, each laid out like the input (padded, or a
        ``PackedSequence`` like it, when the input is packed)."""
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
        precision, out_dtype = torch_precision.call_precision(self, x)
        x = torch_precision.widen(x) if precision == "bf16" else x
        self._check_input(x)
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        states = self._states_in(hx)
        if precision == "bf16":
            states = [torch_precision.widen(s) for s in states]
        self._check_states(states, x.shape[0 if self.batch_first else 1], x.dtype, unbatched)
        if unbatched:
            states = [None if s is None else s.unsqueeze(1) for s in states]
        extras = self._extras_in(extra, unbatched, x.dtype)
        if torch.compiler.is_compiling():  # one opaque op in the compiled graph
            y, *final = torch_ops.apply(self, x, states, lengths, extras)
        else:
            # The seed of the dropout between layers and of the cell's own masks, drawn as
            # torch_ops.apply draws it under torch.compile: the same masks either way.
            seed = int(torch.randint(0, torch_ops.SEED_HIGH, (1,)).item()) \
                if torch_ops.needs_seed(self) else None
            params = [torch_precision.widen(p) for p in self._flat_parameters()]
            y, *final = torch_autograd.apply(self, lengths, seed, x, states, params, extras)
        if out_dtype is not None:  # a .to(torch.bfloat16) module answers in bfloat16
            y, final = y.to(out_dtype), [f.to(out_dtype) for f in final]
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
