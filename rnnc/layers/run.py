"""The forward run of ``rnnc.RNN``: layer after layer, each direction through the compiled cell.

The reverse direction runs the same cell compiled with ``reverse=True``: a scan over
t = T-1 ... 0 on the input as it is, whose masked steps (t past a sequence's length) come
first and hold the initial state, so each sequence starts at its own last step, as PyTorch's
packed sequences do. Outputs are zero past each sequence's length; dropout multiplies each
layer's output but the last by a mask.

A device call (``x`` a device array, ``backend="cuda"``; ``docs/device-calls.md``) runs the
same glue on the device through ``rnnc.layers.arrays.Arrays``, and every cell call is a device
call. Host parameters are packed and uploaded once per layer and direction and reused while
they hold the same values (compared on the host at each call); device parameters are packed
on the device by each cell call. ``layer.transfers`` holds what the glue of the last call
copied between host and device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rnnc import philox
from rnnc import precision as precision_module
from rnnc.api import Tape
from rnnc.device import Device
from rnnc.layers import checks
from rnnc.layers.arrays import Arrays
from rnnc.layers.stack import LayerStack

Result = tuple[np.ndarray, dict[str, np.ndarray], "LayerTape | None"]


@dataclass
class LayerTape:
    """What ``RNN.forward(train=True)`` saved for ``RNN.backward``."""

    owner: LayerStack
    T: int
    B: int
    dtype: np.dtype
    lengths: np.ndarray | None
    tapes: list[list[Tape]]  # [layer][direction]
    dropout_masks: list[np.ndarray | None]  # after layer k, for k < num_layers - 1
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # time-major, as given
    device: Device | None = None  # a device call's device: every array above lives there

    def arrays(self) -> list[Any]:
        """Every array the tape holds (what backward reads), with the cells' inputs."""
        held = [a for row in self.tapes for tape in row for a in tape.env.values()]
        return [*held, *(m for m in self.dropout_masks if m is not None), *self.extra.values()]


def layer_extra(layer: LayerStack, k: int, extra: dict[str, np.ndarray], ops: Arrays
                ) -> dict[str, np.ndarray]:
    """The extra inputs layer ``k`` reads: all of them, or zeros above layer 0 with
    ``extra_inputs="first"``."""
    if k == 0 or layer.extra_inputs == "all":
        return extra
    return {n: ops.zeros_like(a) for n, a in extra.items()}


def reads_extra(layer: LayerStack, k: int) -> bool:
    """Whether layer ``k`` reads the caller's extra inputs (its gradients count)."""
    return bool(layer.extra_sizes) and (k == 0 or layer.extra_inputs == "all")


def call_seed(layer: LayerStack, seed: Any, rng: np.random.Generator) -> int | None:
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


def params_dtype(layer: LayerStack, grid: list[list[Any]]) -> np.dtype:
    """The dtype of a call's parameters (a device array may tell it through its CUDA array
    interface only), which the call's arrays must have; the layer's when there are none."""
    first = next(iter(grid[0][0].values()), None)
    if first is None:
        return layer.dtype
    typestr = getattr(first, "__cuda_array_interface__", {}).get("typestr")
    return np.dtype(first.dtype if typestr is None else typestr)


def run(layer: LayerStack, x: Any, lengths: Any, states: Any, params: Any, train: bool,
        rng: np.random.Generator, apply_dropout: bool | None, extra: Any = None,
        seed: Any = None) -> Result:
    """``(y, final_states, tape)`` of ``RNN.forward`` (the tape is None unless ``train``)."""
    seed = call_seed(layer, seed, rng)
    # bfloat16 data is float32 from here on: a "bf16" layer rounds its GEMM operands
    precision = layer.backend_options.get("precision", "fp32")
    x, states, extra = (precision_module.widen(v, precision) for v in (x, states, extra))
    grid = checks.check_params(layer, params)
    dtype = params_dtype(layer, grid)
    ops = Arrays(checks.call_device(layer, x, extra))
    x = checks.check_x(layer, x, dtype, ops)
    T, B = x.shape[:2]
    lens = checks.check_lengths(layer, lengths, T, B)
    init = checks.check_states(layer, states, B, dtype, T=T, ops=ops)
    extra = checks.check_extra(layer, extra, T, B, dtype, ops.device)
    if B == 0:  # nothing to compute; compiled functions refuse an empty batch
        return run_empty(layer, T, dtype, train, ops)
    L, D = layer.num_layers, layer.num_directions
    grid = cell_params(layer, grid, ops)
    valid = ops.valid_steps(T, lens)
    final = {n: ops.zeros((L * D, B, *s), dtype) for n, s in layer.state_shapes.items()}
    drop = (train if apply_dropout is None else apply_dropout) and layer.dropout > 0
    tapes: list[list[Tape]] = []
    masks: list[np.ndarray | None] = []
    inp = x
    for k in range(L):
        outs, row = [], []
        for d in range(D):
            st0 = {n: init[n][k * D + d] for n in layer.state_sizes}
            seqs = {layer.input_name: inp, **layer_extra(layer, k, extra, ops)} if extra \
                else inp
            y, st, tape = _run_direction(layer, k, d, seqs, grid[k][d], st0, lens, train,
                                         layer_seed(seed, k, d))
            outs.append(ops.zero_past_lengths(y, valid))
            row.append(tape)
            for n in layer.state_sizes:
                final[n][k * D + d] = st[n]
        inp = outs[0] if D == 1 else ops.concatenate(outs, axis=2)
        tapes.append(row)
        if k < L - 1:
            masks.append(ops.dropout_mask(inp.shape, layer.dropout, dtype, rng) if drop
                         else None)
            inp = inp if masks[-1] is None else inp * masks[-1]
    y = inp.transpose(1, 0, 2) if layer.batch_first else inp
    tape = LayerTape(layer, T, B, dtype, lens, tapes, masks, extra, ops.device) if train \
        else None
    layer.transfers = ops.transfers
    return ops.contiguous(y), final, tape


def cell_params(layer: LayerStack, grid: list[list[Any]], ops: Arrays) -> list[list[Any]]:
    """What each cell call of a run takes as its parameters: the grid's dicts in a host call
    or when they are device arrays (packed on the device by the call; a dict mixing host and
    device arrays is refused there), else a flat device buffer uploaded once and reused while
    the host values stay the same."""
    if ops.device is None:
        return grid
    # Kept on the layer, keyed by layer and direction; not pickled (rnnc.layers.rnn).
    uploaded = layer.__dict__.setdefault("_uploaded", {})
    out = []
    for k, row in enumerate(grid):
        out.append([])
        for d, params in enumerate(row):
            if any(ops.device.holds(v) for v in params.values()):
                out[k].append(params)
                continue
            flat = layer.function(k, d).pack(params)  # checks names, shapes and dtypes
            cached = uploaded.get((k, d))
            if cached is None or cached[0].dtype != flat.dtype \
                    or not np.array_equal(cached[0], flat):
                cached = uploaded[k, d] = (flat, ops.upload(flat))
            out[k].append(cached[1])
    return out


def _run_direction(layer: LayerStack, k: int, d: int, inp: Any, params: dict[str, Any],
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


def run_empty(layer: LayerStack, T: int, dtype: np.dtype, train: bool, ops: Arrays) -> Result:
    """The result of an empty batch (B = 0): empty outputs and states, as torch returns."""
    LD = layer.num_layers * layer.num_directions
    width = layer.num_directions * layer.output_size
    y = ops.zeros((0, T, width) if layer.batch_first else (T, 0, width), dtype)
    final = {n: ops.zeros((LD, 0, *s), dtype) for n, s in layer.state_shapes.items()}
    tape = LayerTape(layer, T, 0, dtype, None, [], [], device=ops.device) if train else None
    layer.transfers = ops.transfers
    return y, final, tape
