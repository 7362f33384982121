"""``rnnc::rnn``: ``rnnc.torch.RNN`` as one ``torch.library`` custom op, for ``torch.compile``.

``torch.compile`` cannot trace into NumPy or native code, so while it compiles, the module calls
the custom op ``rnnc::rnn`` instead of its ``autograd.Function``: the compiled graph holds the
whole layer as one opaque op, whose fake rule gives the output shapes and whose backward is a
second op, ``rnnc::rnn_backward``. An op's arguments are tensors and numbers only, so ``key``
names the module's configuration (what decides the code the op runs: the cells' traced programs,
the backend, the layout of inputs and weights, the dropout) in a registry of live modules:
modules of one configuration share a key, so ``torch.compile``, which guards on the key, reuses
one compiled graph for all of them instead of compiling again per module (and, past its limit
of 8, falling back to eager). Any live module of the key runs the call: the weights are the
op's own arguments. An op cannot return rnnc's tape either, so the backward op runs the
training forward again for it (a compiled step costs one forward more than an eager one).

The random seed of a call (dropout between layers, the cell's own ``rnnc.bernoulli`` masks) is
an input of the op, drawn in the graph from torch's generator exactly as the eager path draws
it, and saved for the backward op, whose forward draws the same masks again: the gradients
are those of the masks the forward used, and ``torch.manual_seed`` governs them. A cell's
extra inputs travel as one more tensor list, ``extras`` (in ``module.extra_names`` order, laid
out like ``x``), and get gradients like ``x``. Eager calls never come here: they keep vmap and
double backward.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from rnnc.errors import RnncRuntimeError
from rnnc.interop.torch_autograd import from_numpy, to_numpy
from rnnc.interop.torch_device import unshared

# Configuration -> key, and key -> the live modules of that configuration. A configuration is a
# few strings and numbers, kept for the process so a key never changes meaning.
_KEYS: dict[tuple[Any, ...], int] = {}
_LIVE: dict[int, weakref.WeakSet[Any]] = {}
_KEY_OF: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_ARGS = ("int key, Tensor x, Tensor?[] states, Tensor[] params, Tensor? lengths, Tensor? seed, "
         "bool training, Tensor[] extras")
SEED_HIGH = 2**62  # seeds are drawn in [0, SEED_HIGH) from torch's generator


def configuration(module: Any) -> tuple[Any, ...]:
    """What decides the code ``module``'s op runs, given its arguments: equal for modules
    that compute the same function of their inputs and weights."""
    layer = module.layer
    return (module.mode if isinstance(module.mode, str) else "cell",
            tuple(module._flat_weights_names), module.state_names, module.extra_names,
            layer.batch_first, layer.dropout, layer.extra_inputs, layer.backend,
            repr(sorted(layer.backend_options.items())), np.dtype(layer.dtype).str,
            layer.program_identities())


def register(module: Any) -> int:
    """Make ``module`` (an ``rnnc.torch.RNN``) reachable by the ops under its configuration's
    key, and return the key; called again when its configuration changes (dropout)."""
    config = configuration(module)
    with _LOCK:
        old = _KEY_OF.get(module)
        if old is not None:
            _LIVE[old].discard(module)
        key = _KEYS.setdefault(config, len(_KEYS))
        _LIVE.setdefault(key, weakref.WeakSet()).add(module)
        _KEY_OF[module] = key
    return key


def module_of(key: int) -> Any:
    """A live module of ``key``'s configuration."""
    with _LOCK:
        for module in _LIVE.get(key, ()):
            return module
    raise RnncRuntimeError(f"rnnc::rnn called with key {key}, but no rnnc.torch.RNN of that "
                           f"configuration is alive: keep the module while its compiled "
                           f"graph runs")


def needs_seed(module: Any) -> bool:
    """Whether a call draws a seed: dropout between layers in training, or masks in the cell."""
    return module.training and module.dropout > 0 and module.num_layers > 1 \
        or module.draws_masks


def apply(module: Any, x: torch.Tensor, states: list[torch.Tensor | None],
          lengths: np.ndarray | None, extras: list[torch.Tensor] = ()) -> list[torch.Tensor]:
    """``[y, *final_states]`` through the op, drawing the seed from torch's generator as the
    eager path does; ``extras`` are the cell's extra inputs in ``module.extra_names`` order."""
    seed = torch.randint(0, SEED_HIGH, (1,)) if needs_seed(module) else None
    lens = None if lengths is None else torch.as_tensor(lengths)
    return torch.ops.rnnc.rnn(module._op_key, x, states, module._flat_parameters(), lens, seed,
                              module.training, list(extras))


def _run(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
         params: list[torch.Tensor], lengths: torch.Tensor | None, seed: torch.Tensor | None,
         training: bool, extras: list[torch.Tensor], train: bool
         ) -> tuple[Any, tuple[Any, ...]]:
    """What the eager path's ``torch_autograd._Apply.forward`` computes, on host arrays."""
    module = module_of(key)
    given = {n: to_numpy(s) for n, s in zip(module.state_names, states, strict=True)
             if s is not None}
    extra = {n: to_numpy(e) for n, e in zip(module.extra_names, extras, strict=True)}
    seed = None if seed is None else int(seed.item())
    rng = None if seed is None else np.random.default_rng(seed)
    return module, module.layer.forward(
        to_numpy(x), None if lengths is None else lengths.numpy(), given, train=train,
        params=module._rnnc_params(tuple(params)), rng=rng,
        apply_dropout=seed is not None and training, extra=extra, seed=seed)


def _state_shape(module: Any, x: torch.Tensor, name: str) -> tuple[Any, ...]:
    B = x.shape[0 if module.batch_first else 1]
    return (module.num_layers * (2 if module.bidirectional else 1), B,
            *module.layer.state_shapes[name])


@torch.library.custom_op("rnnc::rnn", mutates_args=(), schema=f"({_ARGS}) -> Tensor[]")
def _rnn(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
         params: list[torch.Tensor], lengths: torch.Tensor | None, seed: torch.Tensor | None,
         training: bool, extras: list[torch.Tensor]) -> list[torch.Tensor]:
    module, (y, final, _) = _run(key, x, states, params, lengths, seed, training, extras,
                                 train=False)
    # An op's results must not alias its inputs (a cell's output may be its input): the
    # compiled graph may write into them, as inductor does into buffers it owns.
    held = [to_numpy(t) for t in (x, *states, *extras, *params) if t is not None]
    return [from_numpy(unshared(np, y, held), x),
            *(from_numpy(unshared(np, final[n], held), x) for n in module.state_names)]


@_rnn.register_fake
def _rnn_fake(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
              params: list[torch.Tensor], lengths: torch.Tensor | None,
              seed: torch.Tensor | None, training: bool, extras: list[torch.Tensor]
              ) -> list[torch.Tensor]:
    module = module_of(key)
    width = (2 if module.bidirectional else 1) * module.layer.output_size
    y = x.new_empty((*x.shape[:2], width))
    return [y, *(x.new_empty(_state_shape(module, x, n)) for n in module.state_names)]


@torch.library.custom_op("rnnc::rnn_backward", mutates_args=(),
                         schema=f"({_ARGS}, Tensor d_y, Tensor[] d_final) -> Tensor[]")
def _rnn_backward(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
                  params: list[torch.Tensor], lengths: torch.Tensor | None,
                  seed: torch.Tensor | None, training: bool, extras: list[torch.Tensor],
                  d_y: torch.Tensor, d_final: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[d_x, *d_states, *d_extras, *d_params]``, of the masks of the forward's seed."""
    module, (_, _, tape) = _run(key, x, states, params, lengths, seed, training, extras,
                                train=True)
    names = module.state_names
    g = module.layer.backward(tape, to_numpy(d_y), {n: to_numpy(d) for n, d in
                                                    zip(names, d_final, strict=True)})
    return [from_numpy(g.x, x), *(from_numpy(g.states[n], x) for n in names),
            *(from_numpy(g.extra[n], x) for n in module.extra_names),
            *(from_numpy(a, x) for a in module._torch_grads(g.params))]


@_rnn_backward.register_fake
def _rnn_backward_fake(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
                       params: list[torch.Tensor], lengths: torch.Tensor | None,
                       seed: torch.Tensor | None, training: bool, extras: list[torch.Tensor],
                       d_y: torch.Tensor, d_final: list[torch.Tensor]) -> list[torch.Tensor]:
    module = module_of(key)
    return [x.new_empty(x.shape),
            *(x.new_empty(_state_shape(module, x, n)) for n in module.state_names),
            *(e.new_empty(e.shape) for e in extras),
            *(p.new_empty(p.shape) for p in params)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
    key, x, states, params, lengths, seed, training, extras = inputs
    ctx.key, ctx.training, ctx.n_states, ctx.n_extras = key, training, len(states), len(extras)
    ctx.given = tuple(s is not None for s in states)
    ctx.shapes = [o.shape for o in output]
    # The seed too: the backward op's forward must draw the masks this forward drew.
    ctx.save_for_backward(x, lengths, seed, *states, *extras, *params)


def _backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[Any, ...]:
    x, lengths, seed, *rest = ctx.saved_tensors
    n_in = ctx.n_states + ctx.n_extras
    states, extras, params = rest[:ctx.n_states], rest[ctx.n_states:n_in], rest[n_in:]
    # An output the loss does not use has no gradient: zeros.
    d_y, *d_final = [x.new_zeros(s) if g is None else g
                     for g, s in zip(grads, ctx.shapes, strict=True)]
    out = torch.ops.rnnc.rnn_backward(ctx.key, x, list(states), list(params), lengths, seed,
                                      ctx.training, list(extras), d_y, d_final)
    d_states = [g if given else None
                for g, given in zip(out[1:1 + ctx.n_states], ctx.given, strict=True)]
    if not any(ctx.given):  # a list of Nones reaches autograd as one None
        d_states = None
    d_extras = list(out[1 + ctx.n_states:1 + n_in])
    return None, out[0], d_states, list(out[1 + n_in:]), None, None, None, d_extras


torch.library.register_autograd("rnnc::rnn", _backward, setup_context=_setup_context)
