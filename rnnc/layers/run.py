"""The forward run of ``rnnc.RNN``: layer after layer, each direction through the compiled cell.

The reverse direction runs the same cell compiled with ``reverse=True``: a scan over
t = T-1 ... 0 on the input as it is, whose masked steps (t past a sequence's length) come
first and hold the initial state, so each sequence starts at its own last step, as PyTorch's
packed sequences do. Outputs are zero past each sequence's length; dropout multiplies each
layer's output but the last by a mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rnnc import philox
from rnnc.api import Tape
from rnnc.layers import checks

if TYPE_CHECKING:
    from rnnc.layers.rnn import RNN

Result = tuple[np.ndarray, dict[str, np.ndarray], "LayerTape | None"]


@dataclass
class LayerTape:
    """What ``RNN.forward(train=True)`` saved for ``RNN.backward``."""

    owner: RNN
    T: int
    B: int
    dtype: np.dtype
    lengths: np.ndarray | None
    tapes: list[list[Tape]]  # [layer][direction]
    dropout_masks: list[np.ndarray | None]  # after layer k, for k < num_layers - 1
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # time-major, as given


def layer_extra(layer: RNN, k: int, extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The extra inputs layer ``k`` reads: all of them, or zeros above layer 0 with
    ``extra_inputs="first"``."""
    if k == 0 or layer.extra_inputs == "all":
        return extra
    return {n: np.zeros_like(a) for n, a in extra.items()}


def reads_extra(layer: RNN, k: int) -> bool:
    """Whether layer ``k`` reads the caller's extra inputs (its gradients count)."""
    return bool(layer.extra_sizes) and (k == 0 or layer.extra_inputs == "all")


def valid_steps(T: int, lens: np.ndarray | None) -> np.ndarray | None:
    """Return a ``(T, B, 1)`` mask, true inside each sequence's length (None: all valid)."""
    if lens is None:
        return None
    return (np.arange(T)[:, None] < lens[None, :])[:, :, None]


def zero_past_lengths(a: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """Return ``a`` with the steps past each sequence's length set to zero."""
    return a if valid is None else np.where(valid, a, 0).astype(a.dtype, copy=False)


def call_seed(layer: RNN, seed: Any, rng: np.random.Generator) -> int | None:
    """The seed of a call's random masks (``rnnc.bernoulli`` in the cell): ``seed`` checked,
    or, when it is None and the cell draws masks, one drawn from the layer's stream ``rng``."""
    if seed is not None:
        return philox.check_seed(seed)
    return int(rng.integers(philox.SEED_LIMIT, dtype=np.uint64)) if layer.draws_masks else None


def layer_seed(seed: int | None, k: int, d: int) -> int | None:
    """The seed of layer ``k``'s direction ``d``: each its own masks, all from one seed."""
    if seed is None:
        return None
    words = np.random.SeedSequence([seed, k, d]).generate_state(2, np.uint32)
    return int(words[0]) | int(words[1]) << 32


def run(layer: RNN, x: Any, lengths: Any, states: Any, params: Any, train: bool,
        rng: np.random.Generator, apply_dropout: bool | None, extra: Any = None,
        seed: Any = None) -> Result:
    """``(y, final_states, tape)`` of ``RNN.forward`` (the tape is None unless ``train``)."""
    seed = call_seed(layer, seed, rng)
    grid = checks.check_params(layer, params)
    dtype = np.dtype(next(iter(grid[0][0].values())).dtype) if grid[0][0] else layer.dtype
    x = checks.check_x(layer, x, dtype)
    T, B = x.shape[:2]
    lens = checks.check_lengths(layer, lengths, T, B)
    init = checks.check_states(layer, states, B, dtype, T=T)
    extra = checks.check_extra(layer, extra, T, B, dtype)
    if B == 0:  # nothing to compute; compiled functions refuse an empty batch
        return run_empty(layer, T, dtype, train)
    L, D = layer.num_layers, layer.num_directions
    valid = valid_steps(T, lens)
    final = {n: np.empty((L * D, B, s), dtype) for n, s in layer.state_sizes.items()}
    drop = (train if apply_dropout is None else apply_dropout) and layer.dropout > 0
    tapes: list[list[Tape]] = []
    masks: list[np.ndarray | None] = []
    inp = x
    for k in range(L):
        outs, row = [], []
        for d in range(D):
            st0 = {n: init[n][k * D + d] for n in layer.state_sizes}
            seqs = {layer.input_name: inp, **layer_extra(layer, k, extra)} if extra else inp
            y, st, tape = _run_direction(layer, k, d, seqs, grid[k][d], st0, lens, train,
                                         layer_seed(seed, k, d))
            outs.append(zero_past_lengths(y, valid))
            row.append(tape)
            for n in layer.state_sizes:
                final[n][k * D + d] = st[n]
        inp = outs[0] if D == 1 else np.concatenate(outs, axis=2)
        tapes.append(row)
        if k < L - 1:
            masks.append(dropout_mask(inp.shape, layer.dropout, dtype, rng) if drop else None)
            inp = inp if masks[-1] is None else inp * masks[-1]
    y = inp.transpose(1, 0, 2) if layer.batch_first else inp
    tape = LayerTape(layer, T, B, dtype, lens, tapes, masks, extra) if train else None
    return np.ascontiguousarray(y), final, tape


def _run_direction(layer: RNN, k: int, d: int, inp: Any, params: dict[str, Any],
                   st0: dict[str, np.ndarray], lens: np.ndarray | None, train: bool,
                   seed: int | None) -> tuple[np.ndarray, dict[str, np.ndarray], Tape | None]:
    """One direction ``d`` of layer ``k``: its output in time order, final states and tape."""
    fn = layer.function(k, d)
    tape = None
    if train:
        ys, st, tape = fn.forward(inp, params, st0, lens, seed=seed)
    else:
        ys, st = fn(inp, params, st0, lens, seed=seed)
    return ys[layer.output_name], st, tape


def dropout_mask(shape: tuple[int, ...], p: float, dtype: np.dtype,
                 rng: np.random.Generator) -> np.ndarray:
    """Inverted dropout: zero with probability ``p``, else ``1 / (1 - p)``."""
    keep = rng.random(shape) >= p
    if p < 1.0:
        return keep.astype(dtype) / dtype.type(1.0 - p)
    return np.zeros(shape, dtype)  # torch's dropout=1 zeroes everything


def run_empty(layer: RNN, T: int, dtype: np.dtype, train: bool) -> Result:
    """The result of an empty batch (B = 0): empty outputs and states, as torch returns."""
    LD = layer.num_layers * layer.num_directions
    width = layer.num_directions * layer.output_size
    y = np.zeros((0, T, width) if layer.batch_first else (T, 0, width), dtype)
    final = {n: np.zeros((LD, 0, s), dtype) for n, s in layer.state_sizes.items()}
    tape = LayerTape(layer, T, 0, dtype, None, [], []) if train else None
    return y, final, tape
