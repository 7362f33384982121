"""``rnnc bench --precision bf16``: rnnc with bfloat16 GEMMs against the peers' bfloat16 paths.

The rows come in the same run as the float32 ones, for the same configuration, cell and mode:

- ``torch-bf16``: ``nn.LSTM``/``nn.GRU`` moved with ``.to(torch.bfloat16)``, on a bfloat16
  input (oneDNN runs the whole cell in bfloat16, elementwise math too);
- ``torch-autocast``: the float32 module under ``torch.autocast("cpu", dtype=torch.bfloat16)``,
  the semantics rnnc's ``precision="bf16"`` follows;
- ``eager-autocast`` and ``compile-autocast`` (``--peers eager``, ``compile``): the float32
  PyTorch loop over the cell's step (``peers.torch_eager_call``) and its ``torch.compile``d
  form, the forward run under ``torch.autocast("cpu", dtype=torch.bfloat16)``; every cell,
  the layer-norm LSTM's only peer that computes in bfloat16;
- ``jax-bf16``: the ``lax.scan`` peer with bfloat16 weights and input, where JAX imports;
- ``rnnc-fp32``: rnnc itself in float32, timed in the same block, so that every cell (the
  layer-norm LSTM too, which has no built-in peer) gets its bfloat16 / float32 ratio.

rnnc runs ``rnnc.RNN(..., precision="bf16")`` on the float32 input. Every row carries the
GFLOP/s of both sides (:func:`~.configs.gemm_flop`); ``max_abs_diff`` compares the outputs,
which differ by bfloat16 rounding here, not float32's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc.tools.bench.configs import CELLS, CellSpec, Config, layer_params
from rnnc.tools.bench.harness import rnnc_call, rows_of, timed
from rnnc.tools.bench.peers import jax_call, torch_eager_call, torch_module

PRECISIONS = ("fp32", "bf16")


def torch_bf16_call(spec: CellSpec, config: Config, grid: list, mode: str, how: str
                    ) -> tuple[Callable[[Any], Any], str]:
    """nn.LSTM / nn.GRU in bfloat16: moved to it (``how="to"``) or under autocast."""
    import torch

    module = torch_module(spec, config, grid)
    if how == "to":
        module = module.to(torch.bfloat16)
        label = f"nn.{spec.torch_module}.to(bfloat16)"

        def run(x):
            return module(x.to(torch.bfloat16))[0]
    else:
        label = f"nn.{spec.torch_module} autocast"

        def run(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return module(x)[0]

    if mode == "inference":
        def infer(x):
            with torch.no_grad():
                return run(x).float()
        return infer, label

    def train(x):
        module.zero_grad(set_to_none=True)
        y = run(x.detach().requires_grad_(True))
        y.float().sum().backward()
        return y.float()
    return train, label


def jax_bf16_call(spec: CellSpec, config: Config, grid: list, mode: str
                  ) -> tuple[Callable[[Any], Any], str]:
    """The ``lax.scan`` peer with bfloat16 weights; the input is cast where it is called."""
    import ml_dtypes

    bf16 = [[{k: v.astype(ml_dtypes.bfloat16) for k, v in p.items()} for p in row]
            for row in grid]
    fn, label = jax_call(spec, config, bf16, mode)
    return (lambda x: fn(x.astype("bfloat16"))), f"{label} bfloat16"


def bench_bf16(config: Config, cell: str, mode: str, peers: list[str],
               args: argparse.Namespace, options: dict) -> list[dict[str, Any]]:
    """The bfloat16 rows of one configuration, cell and mode (see the module docstring)."""
    spec = CELLS[cell]
    grid = layer_params(spec, config)
    x = np.random.default_rng(7).standard_normal((config.T, config.B, config.I)).astype(
        np.float32)
    run_rnnc, how = rnnc_call(spec, config, grid, mode, args.backend,
                              {**options, "precision": "bf16"})
    run_fp32, _ = rnnc_call(spec, config, grid, mode, args.backend, options)
    calls: dict[str, Callable[[], Any]] = {"rnnc": lambda: run_rnnc(x),
                                           "rnnc-fp32": lambda: run_fp32(x)}
    labels = {"rnnc": how + " bf16", "rnnc-fp32": how + " fp32"}
    if "torch" in peers and spec.torch_module is not None:
        import torch

        xt = torch.from_numpy(x)
        for name, kind in (("torch-bf16", "to"), ("torch-autocast", "autocast")):
            fn, labels[name] = torch_bf16_call(spec, config, grid, mode, kind)
            calls[name] = lambda fn=fn: fn(xt)
    for peer in ("eager", "compile"):
        if peer in peers:
            import torch

            xt = torch.from_numpy(x)
            fn, labels[f"{peer}-autocast"] = torch_eager_call(
                spec, config, grid, mode, compiled=peer == "compile", autocast=True)
            calls[f"{peer}-autocast"] = lambda fn=fn, xt=xt: fn(xt)
    if "jax" in peers:
        import jax.numpy as jnp

        fn, labels["jax-bf16"] = jax_bf16_call(spec, config, grid, mode)
        xj = jnp.asarray(x)
        calls["jax-bf16"] = lambda fn=fn: fn(xj)
    timings, firsts = timed(calls, args.reps, args.warmup, getattr(args, "clock", "wall"))
    return rows_of(config, cell, mode, timings, firsts, labels, "bf16")
