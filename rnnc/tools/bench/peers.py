"""rnnc's peers in ``rnnc bench``: PyTorch's built-in modules, a PyTorch eager loop, JAX.

Each peer runs a cell's one step function (``steps.py``, named by the cell's ``CellSpec``). A
peer's ``..._call`` returns a callable ``x -> y`` (training: forward and backward of ``sum(y)``)
and a label of what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rnnc.tools.bench.configs import CellSpec, Config

# ---------------------------------------------------------------- PyTorch


class _TorchMath:
    def __init__(self, torch) -> None:
        self.sigmoid, self.tanh, self.rsqrt = torch.sigmoid, torch.tanh, torch.rsqrt
        # The cells with feature shapes (tensor_steps.py) use these too.
        self.exp, self.maximum, self.einsum = torch.exp, torch.maximum, torch.einsum
        self.softplus = torch.nn.functional.softplus
        self.log_sigmoid = torch.nn.functional.logsigmoid

    @staticmethod
    def mean(v):
        return v.mean(-1, keepdim=True)


def torch_module(spec: CellSpec, config: Config, grid: list) -> Any:
    """A new ``nn.LSTM`` / ``nn.GRU`` holding the same weights as rnnc (on the CPU)."""
    import torch

    from rnnc.interop.weights import layers_to_torch_state_dict

    module = getattr(torch.nn, spec.torch_module)(
        config.I, config.H, num_layers=config.layers, bidirectional=config.directions == 2)
    state = layers_to_torch_state_dict(spec.mode, grid)
    with torch.no_grad():
        module.load_state_dict({n: torch.from_numpy(a) for n, a in state.items()})
    return module


def torch_builtin_call(spec: CellSpec, config: Config, grid: list, mode: str):
    """nn.LSTM / nn.GRU holding the same weights as rnnc (PyTorch's gate order and layout)."""
    import torch

    module = torch_module(spec, config, grid)
    if mode == "inference":
        def infer(x):
            with torch.no_grad():
                return module(x)[0]
        return infer, f"nn.{spec.torch_module}"

    def train(x):
        module.zero_grad(set_to_none=True)
        x = x.detach().requires_grad_(True)
        y = module(x)[0]
        y.sum().backward()
        return y
    return train, f"nn.{spec.torch_module}"


def torch_eager_call(spec: CellSpec, config: Config, grid: list, mode: str,
                     device: str = "cpu", compiled: bool = False, autocast: bool = False):
    """A Python loop over time of the same cell, one small PyTorch op at a time, with its
    weights on ``device`` (the input must be there too); ``compiled``: the loop calls
    ``torch.compile`` of the step (compiling the whole loop unrolls every step);
    ``autocast``: the forward runs under ``torch.autocast(device, dtype=torch.bfloat16)``
    and the output comes back in float32 (the backward runs outside autocast, as PyTorch
    recommends: each op's gradient takes its forward's dtype)."""
    import torch

    label = "compiled step loop" if compiled else "eager loop"
    label += " autocast" if autocast else ""
    m = _TorchMath(torch)
    if compiled:
        # torch.compile keeps its graphs on the step function's code, shared by every compiled
        # peer of the cell; past recompile_limit (8) shapes, grad modes and autocast states it
        # runs the step eagerly without failing. The peer being built is the only one timed.
        torch._dynamo.reset()
    step = torch.compile(spec.step, dynamic=False) if compiled else spec.step
    weights = [[{k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in
                 spec.peer_params(p).items()} for p in row] for row in grid]
    leaves = [w for row in weights for q in row for w in q.values()]

    def forward(x):
        if autocast:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                return layers(x).float()
        return layers(x)

    def layers(x):
        T, B = x.shape[0], x.shape[1]
        for row in weights:
            outs = []
            for d, q in enumerate(row):
                state = tuple(x.new_zeros((B, *shape)) for shape in spec.features(config))
                ys = [None] * T
                for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                    ys[t], state = step(m, x[t], state, q)
                outs.append(torch.stack(ys))
            x = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        return x

    if mode == "inference":
        def infer(x):
            with torch.no_grad():
                return forward(x)
        return infer, label

    def train(x):
        for w in leaves:
            w.grad = None
            w.requires_grad_(True)
        x = x.detach().requires_grad_(True)
        y = forward(x)
        y.sum().backward()
        return y
    return train, label


# ---------------------------------------------------------------- JAX



def jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def jax_call(spec: CellSpec, config: Config, grid: list, mode: str):
    """jax.lax.scan of the same cell under jax.jit; training is jax.grad of sum(y), jitted."""
    import jax
    import jax.numpy as jnp

    class m:
        sigmoid, tanh, rsqrt = jax.nn.sigmoid, jnp.tanh, jax.lax.rsqrt
        exp, maximum, einsum = jnp.exp, jnp.maximum, jnp.einsum
        softplus, log_sigmoid = jax.nn.softplus, jax.nn.log_sigmoid

        @staticmethod
        def mean(v):
            return jnp.mean(v, -1, keepdims=True)

    weights = [[{k: jnp.asarray(v) for k, v in spec.peer_params(p).items()} for p in row]
               for row in grid]

    def forward(weights, x):
        B = x.shape[1]
        for row in weights:
            outs = []
            for d, q in enumerate(row):
                def body(state, xt, q=q):
                    y, state = spec.step(m, xt, state, q)
                    return state, y
                init = tuple(jnp.zeros((B, *shape), x.dtype) for shape in spec.features(config))
                outs.append(jax.lax.scan(body, init, x, reverse=d == 1)[1])
            x = outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)
        return x

    if mode == "inference":
        fwd = jax.jit(forward)
        return (lambda x: fwd(weights, x).block_until_ready()), "lax.scan+jit"

    def loss(weights, x):
        y = forward(weights, x)
        return jnp.sum(y), y

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))

    def train(x):
        g, y = grad(weights, x)
        jax.block_until_ready(g)
        return y
    return train, "lax.scan+jit"
