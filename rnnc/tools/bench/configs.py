"""What ``rnnc bench`` measures: the configurations (shapes), the cells and the modes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import rnnc
from rnnc.tools.bench import steps, tensor_steps


@dataclass(frozen=True)
class Config:
    """One benchmark shape (docs/benchmarks.md): T steps, B batch, I input, H hidden."""

    name: str
    T: int
    B: int
    I: int  # noqa: E741 - the paper's name
    H: int
    layers: int = 1
    directions: int = 1


CONFIGS = {
    "C1": Config("C1", 100, 64, 512, 512),
    "C2": Config("C2", 100, 1, 256, 256),
    "C3": Config("C3", 50, 16, 128, 128),
    "C4": Config("C4", 200, 32, 256, 256, layers=2, directions=2),
    # The selective SSM's target (issue 33): D = I = H = 256 channels of 16 states each.
    "SSM": Config("SSM", 1024, 8, 256, 256),
}


def tiny(config: Config) -> Config:
    """The same structure (layers, directions) at a size that runs in milliseconds."""
    return Config(f"{config.name}-tiny", 5, 2, 8, 8, config.layers, config.directions)


def ln_lstm(input_size: int, hidden_size: int) -> rnnc.Cell:
    """Layer-norm LSTM as in PyTorch's fastrnns: LN on both gate projections and on c."""
    H = hidden_size
    c = rnnc.Cell("ln_lstm")
    x = c.input("x", input_size)
    h = c.state("h", H)
    cs = c.state("c", H)
    W = c.param("W", (input_size, 4 * H))
    U = c.param("U", (H, 4 * H))
    gi, bi = c.param("g_i", (4 * H,), init=1.0), c.param("b_i", (4 * H,), init=0.0)
    gh, bh = c.param("g_h", (4 * H,), init=1.0), c.param("b_h", (4 * H,), init=0.0)
    gc, bc = c.param("g_c", (H,), init=1.0), c.param("b_c", (H,), init=0.0)
    gates = rnnc.layer_norm(x @ W, gi, bi) + rnnc.layer_norm(h @ U, gh, bh)
    i, f = rnnc.sigmoid(gates[:, 0:H]), rnnc.sigmoid(gates[:, H:2 * H])
    g, o = rnnc.tanh(gates[:, 2 * H:3 * H]), rnnc.sigmoid(gates[:, 3 * H:4 * H])
    c_new = rnnc.layer_norm(f * cs + i * g, gc, bc)
    h_new = o * rnnc.tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


@dataclass(frozen=True)
class CellSpec:
    """A benchmarked cell: rnnc's mode or factory, the peers' step and parameter mapping."""

    mode: str | Callable[[int, int], rnnc.Cell]  # what rnnc.RNN takes
    step: Callable
    peer_params: Callable[[dict], dict]
    states: tuple[str, ...]
    torch_module: str | None = None  # "LSTM" or "GRU": a built-in to compare with
    # The states' feature shapes for a config (default (H,) each): cells with feature shapes,
    # which rnnc runs through rnnc.compile (one layer), not rnnc.RNN.
    state_shapes: Callable[[Config], tuple[tuple[int, ...], ...]] | None = None

    def features(self, config: Config) -> tuple[tuple[int, ...], ...]:
        """Each state's feature shape, in the order of ``states``."""
        if self.state_shapes is None:
            return ((config.H,),) * len(self.states)
        return self.state_shapes(config)

    @property
    def factory(self) -> Callable[[int, int], rnnc.Cell]:
        """The cell factory: ``(input_size, hidden_size) -> Cell``."""
        return rnnc.cells.STANDARD[self.mode] if isinstance(self.mode, str) else self.mode


CELLS = {
    "lstm": CellSpec("lstm", steps.lstm_step, steps.lstm_params, ("h", "c"), "LSTM"),
    "gru": CellSpec("gru", steps.gru_step, steps.gru_params, ("h",), "GRU"),
    "mgu": CellSpec(rnnc.cells.mgu, steps.mgu_step, steps.mgu_params, ("h",)),
    "peephole_lstm": CellSpec(rnnc.cells.peephole_lstm, steps.peephole_step,
                              steps.peephole_params, ("h", "c")),
    "ln_lstm": CellSpec(ln_lstm, steps.ln_lstm_step, dict, ("h", "c")),
    "slstm": CellSpec(tensor_steps.slstm, tensor_steps.slstm_step, dict, ("h", "c", "n", "m"),
                      state_shapes=tensor_steps.slstm_states),
    "slstm_slices": CellSpec(tensor_steps.slstm_slices, tensor_steps.slstm_step,
                             tensor_steps.slices_params, ("h", "c", "n", "m"),
                             state_shapes=tensor_steps.slstm_states),
    "selective_ssm": CellSpec(tensor_steps.selective_ssm, tensor_steps.ssm_step, dict, ("h",),
                              state_shapes=tensor_steps.ssm_states),
}
# The cells "all" means: the ones with feature shapes run by name (--cells slstm,...).
DEFAULT_CELLS = ("lstm", "gru", "mgu", "peephole_lstm", "ln_lstm")
PEERS = ("torch", "eager", "compile", "jax")
MODES = ("inference", "training")


def layer_params(spec: CellSpec, config: Config) -> list[list[dict[str, np.ndarray]]]:
    """rnnc parameters of every layer and direction, each from its own seed."""
    grid = []
    for layer in range(config.layers):
        size = config.I if layer == 0 else config.directions * config.H
        cell = spec.factory(size, config.H)
        grid.append([cell.init_params(seed=100 * layer + d) for d in range(config.directions)])
    return grid


def gemm_flop(spec: CellSpec, config: Config, mode: str) -> float:
    """The floating-point operations of the cell's GEMMs over one call of ``config``: 2 per
    multiply-add of every matmul of every layer, direction and step; training does three
    times the forward's (the forward, and the two gradient GEMMs of each product)."""
    from rnnc import ops

    per_row = 0
    for layer in range(config.layers):
        size = config.I if layer == 0 else config.directions * config.H
        body = spec.factory(size, config.H).program().scan.body
        for node in body.nodes():
            if node.op is ops.matmul:
                k, n = body.node(node.inputs[0]).shape[-1], node.shape[-1]
                per_row += 2 * k * n * config.directions
    return float(per_row * config.T * config.B * (3 if mode == "training" else 1))
