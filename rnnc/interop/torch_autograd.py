"""The ``torch.autograd.Function``s behind ``rnnc.torch.RNN``.

``apply`` runs the module's layers as one ``autograd.Function`` over ``rnnc.RNN.forward`` and
``backward``; its backward is a second ``autograd.Function`` whose own backward is a third,
``rnnc.RNN.double_backward``, whose backward refuses a third derivative. All have ``vmap``
rules, so ``torch.func.vmap`` and ``gradcheck``'s and ``gradgradcheck``'s batched checks work
through them. Tensors cross into rnnc through the bridge of ``rnnc.interop.torch_device``:
NumPy views of CPU tensors, or, for CUDA tensors with the CUDA backend on a GPU, device arrays
read in place, forward and backward alike (double backward runs on the host and refuses a
device call's tape).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rnnc.errors import RnncRuntimeError
from rnnc.interop import torch_device
from rnnc.interop.torch_device import from_numpy, to_numpy
from rnnc.interop.torch_hooks import TorchRNN

__all__ = ["apply", "from_numpy", "to_numpy"]


def apply(module: TorchRNN, lengths: np.ndarray | None, seed: int | None, x: torch.Tensor,
          states: list[torch.Tensor | None], params: list[torch.Tensor],
          extras: list[torch.Tensor] = ()) -> tuple[torch.Tensor, ...]:
    """``(y, *final_states)`` of ``module``'s layers, differentiable by torch's autograd.

    ``seed`` seeds the dropout masks in training and the cell's own masks (None: no dropout,
    and a cell without masks); ``params`` are the module's
    parameters in ``_flat_parameters`` order; ``extras`` the cell's extra inputs in
    ``module.extra_names`` order.
    """
    box = _Box()
    # Under torch.no_grad (or inference_mode) nothing can call backward: the layer runs its
    # inference programs, which write no tape. (Grad mode is off inside forward itself, so
    # it is read here.)
    box.train = torch.is_grad_enabled()
    return _Apply.apply(module, lengths, seed, box, x, *states, *extras, *params)


class _Box:
    """Carries the layer's tape from ``_Apply.forward`` to ``setup_context`` (not a tensor),
    and whether the forward records one."""

    tape: Any = None
    train: bool = True


class _Apply(torch.autograd.Function):
    """``(x, *states, *extras, *params) -> (y, *final_states)`` through rnnc's layer.

    Written in the functorch style (``setup_context`` apart from ``forward``) so that
    ``torch.func.vmap`` can batch it: the ``vmap`` rule folds the vmapped dimension into the
    batch when only inputs and states are batched, and loops over it otherwise.
    """

    @staticmethod
    def forward(module: TorchRNN, lengths: np.ndarray | None, seed: int | None, box: _Box,
                x: torch.Tensor, *tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        names, ns, ne = module.state_names, len(module.state_names), len(module.extra_names)
        side = torch_device.bridge(module, x)
        rng = None if seed is None else np.random.default_rng(seed)
        dropout = seed is not None and module.training
        with side.context():
            states = {n: side.array(s, f"state {n!r}")
                      for n, s in zip(names, tensors, strict=False) if s is not None}
            extra = {n: side.array(e, f"extra input {n!r}")
                     for n, e in zip(module.extra_names, tensors[ns:ns + ne], strict=True)}
            grid = side.params(module, tensors[ns + ne:])
            x_in = side.array(x, "x")
            y, final, box.tape = module.layer.forward(
                x_in, lengths, states, train=box.train, params=grid, rng=rng,
                apply_dropout=dropout, extra=extra, seed=seed)
            # A result may be a value the tape saved (a cell's output that its derivative
            # reads) or an input (an output that is the input): the caller may change it in
            # place, as nn.LSTM's, so it gets its own memory there, and only there.
            saved = box.tape.arrays() if box.tape is not None else ()
            held = [x_in, *states.values(), *extra.values(), *saved]
            return (side.output(y, x, held), *(side.output(final[n], x, held) for n in names))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        module, _, _, box, x, *tensors = inputs
        ctx.module, ctx.tape = module, box.tape
        ctx.given = tuple(s is not None for s in tensors[:len(module.state_names)])
        # The tape reads x, the states and the weights in place (no copies). Saving them makes
        # autograd check their versions: changed in place before backward, backward raises
        # "modified by an inplace operation" as nn.LSTM does, instead of wrong gradients.
        ctx.save_for_backward(x, *tensors)

    @staticmethod
    def backward(ctx: Any, d_y: torch.Tensor, *d_final: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        # Reading them is the version check; passing them on makes the gradients functions of
        # x, the states and the weights too, for double backward.
        primals = ctx.saved_tensors

        def run(*cotangents: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _Backward.apply(ctx.module, ctx.tape, ctx.given, *cotangents, *primals)

        grads = list(_legacy_vmap_loop(run, (d_y, *d_final)))
        d_x = grads.pop(0)
        d_states = [grads.pop(0) if given else None for given in ctx.given]
        return (None, None, None, None, d_x, *d_states, *grads)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], module: TorchRNN,
             lengths: np.ndarray | None, seed: int | None, box: _Box, x: torch.Tensor,
             *tensors: torch.Tensor | None) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
        n_inputs = 1 + len(module.state_names) + len(module.extra_names)
        dims = in_dims[4:]
        if all(d is None for d in dims[n_inputs:]):
            return _fold_vmap(info.batch_size, dims, module, lengths, seed, x, tensors)
        return _loop_vmap(info.batch_size, dims, lambda *a: _Apply.apply(
            module, lengths, seed, _Box(), *a), (x, *tensors))


def _fold_vmap(V: int, dims: tuple[int | None, ...], module: TorchRNN, lengths: np.ndarray | None,
               seed: int | None, x: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]
               ) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """Run a vmap over inputs and states only as one call with batch ``V * B``."""
    axis = 0 if module.batch_first else 1  # the batch axis of x and extras; states' is 1
    n_states, n_extra = len(module.state_names), len(module.extra_names)

    def fold(t: torch.Tensor | None, dim: int | None, at: int) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.unsqueeze(0).expand(V, *t.shape) if dim is None else t.movedim(dim, 0)
        t = t.movedim(0, at)  # (..., V, B, ...): V becomes the outer part of the batch
        return t.reshape(*t.shape[:at], -1, *t.shape[at + 2:])

    xs = fold(x, dims[0], axis)
    states = [fold(s, d, 1) for s, d in zip(tensors[:n_states], dims[1:1 + n_states],
                                            strict=True)]
    n_in = n_states + n_extra
    extras = [fold(e, d, axis) for e, d in zip(tensors[n_states:n_in],
                                               dims[1 + n_states:1 + n_in], strict=True)]
    lens = None if lengths is None else np.tile(lengths, V)
    y, *final = _Apply.apply(module, lens, seed, _Box(), xs, *states, *extras,
                             *tensors[n_in:])
    unfold = [(y, axis)] + [(f, 1) for f in final]
    out = tuple(t.reshape(*t.shape[:at], V, -1, *t.shape[at + 1:]) for t, at in unfold)
    return out, tuple(at for _, at in unfold)


def _loop_vmap(V: int, dims: tuple[int | None, ...], run: Any,
               args: tuple[torch.Tensor | None, ...]
               ) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """Run a vmap as ``V`` calls, one per slice, stacking the results on dimension 0."""
    results = []
    for i in range(V):
        results.append(run(*(a if d is None or a is None else a.select(d, i)
                             for a, d in zip(args, dims, strict=True))))
    out = tuple(torch.stack(parts) for parts in zip(*results, strict=True))
    return out, (0,) * len(out)


def _legacy_vmap_loop(run: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``run(*args)``, looping over the batch when ``args`` are batched by the legacy
    ``torch._vmap_internals.vmap`` (what ``gradcheck(check_batched_grad=True)`` uses over
    backward), which, unlike ``torch.func.vmap``, ignores an autograd.Function's vmap rule.
    """
    batched = [torch._C._functorch.is_legacy_batchedtensor(a) for a in args]
    if not any(batched):
        return run(*args)
    level = torch._C._vmapmode_increment_nesting() - 1  # the innermost level: the caller's
    torch._C._vmapmode_decrement_nesting()
    # batch size 1 is only a hint: a batched tensor comes back with its own batch size
    physical = [torch._remove_batch_dim(a, level, 1, 0) if b else a
                for a, b in zip(args, batched, strict=True)]
    V = next(p.shape[0] for p, b in zip(physical, batched, strict=True) if b)
    results = [run(*(p[i] if b else p for p, b in zip(physical, batched, strict=True)))
               for i in range(V)]
    return tuple(torch._add_batch_dim(torch.stack(parts), 0, level)
                 for parts in zip(*results, strict=True))


class _Backward(torch.autograd.Function):
    """``(d_y, *d_final) -> (d_x, *d_given_states, *d_extras, *d_params)`` from a forward's
    tape.

    A function of its own so that a vmap over gradients (``gradcheck``'s batched checks)
    has a rule: a loop over the cotangents, reusing the tape. It also takes the forward's
    ``x``, states and weights (``primals``; the tape already holds their values) so that its
    own derivative, double backward (:class:`_DoubleBackward`), reaches them.
    """

    @staticmethod
    def forward(module: TorchRNN, tape: Any, given: tuple[bool, ...], d_y: torch.Tensor,
                *rest: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        names = module.state_names
        d_final = rest[:len(names)]
        side = torch_device.bridge(module, d_y)
        with side.context():
            g = module.layer.backward(tape, side.array(d_y, "d_y"), {
                n: side.array(d, f"state gradient {n!r}")
                for n, d in zip(names, d_final, strict=True)})
            d_states = [side.tensor(g.states[n], d_y)
                        for n, k in zip(names, given, strict=True) if k]
            d_extras = [side.tensor(g.extra[n], d_y) for n in module.extra_names]
            d_params = side.grads(module, g.params, d_y)
            return (side.tensor(g.x, d_y), *d_states, *d_extras, *d_params)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        module, tape, given, d_y, *rest = inputs
        ctx.module, ctx.tape, ctx.given = module, tape, given
        # The primals too: double backward's results depend on them, so its graph (and its
        # refusal of a third derivative) must reach them.
        ctx.save_for_backward(d_y, *rest)

    @staticmethod
    def backward(ctx: Any, *cotangents: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved, n_states = ctx.saved_tensors, len(ctx.module.state_names)

        def run(*u: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _DoubleBackward.apply(ctx.module, ctx.tape, ctx.given, len(u), *u, *saved)

        grads = list(_legacy_vmap_loop(run, cotangents))
        c_dy, c_d_final, c_x = grads[0], grads[1:1 + n_states], grads[1 + n_states]
        rest = grads[2 + n_states:]
        c_states = [rest.pop(0) if given else None for given in ctx.given]
        return (None, None, None, c_dy, *c_d_final, c_x, *c_states, *rest)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], module: TorchRNN, tape: Any,
             given: tuple[bool, ...], d_y: torch.Tensor, *rest: torch.Tensor | None
             ) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
        return _loop_vmap(info.batch_size, in_dims[3:], lambda *a: _Backward.apply(
            module, tape, given, *a), (d_y, *rest))


class _DoubleBackward(torch.autograd.Function):
    """Double backward: the cotangents ``u`` of :class:`_Backward`'s results, then its inputs
    ``(d_y, *d_final, x, *states, *extras, *params)`` -> the cotangents of
    ``(d_y, *d_final, x, *given_states, *extras, *params)``, by
    ``rnnc.RNN.double_backward``, which differentiates rnnc's backward programs.

    Its own derivative, a third derivative, is not implemented: it raises. Its results depend
    on all its inputs, so any third derivative through the module reaches that refusal,
    instead of dropping the terms through it.
    """

    @staticmethod
    def forward(module: TorchRNN, tape: Any, given: tuple[bool, ...], n_u: int,
                *tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        names = module.state_names
        u, (d_y, *rest) = list(tensors[:n_u]), tensors[n_u:]
        d_final = rest[:len(names)]
        u_x = to_numpy(u.pop(0))
        u_states = {n: to_numpy(u.pop(0)) if k else np.zeros_like(to_numpy(d))
                    for n, k, d in zip(names, given, d_final, strict=True)}
        u_extra = {n: to_numpy(u.pop(0)) for n in module.extra_names}
        c_dy, c_d_states, c = module.layer.double_backward(
            tape, to_numpy(d_y), {n: to_numpy(d) for n, d in zip(names, d_final, strict=True)},
            u_x, module._rnnc_params(tuple(u)), u_states, u_extra)
        return (from_numpy(c_dy, d_y), *(from_numpy(c_d_states[n], d_y) for n in names),
                from_numpy(c.x, d_y),
                *(from_numpy(c.states[n], d_y) for n, k in zip(names, given, strict=True) if k),
                *(from_numpy(c.extra[n], d_y) for n in module.extra_names),
                *(from_numpy(a, d_y) for a in module._torch_grads(c.params)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        raise RnncRuntimeError(
            "rnnc.torch.RNN is differentiable twice, not three times: this asks for a third "
            "derivative (the derivative of a second derivative taken with create_graph=True), "
            "which rnnc does not implement. Take at most second derivatives through the module")

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], module: TorchRNN, tape: Any,
             given: tuple[bool, ...], n_u: int, *tensors: torch.Tensor | None
             ) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
        return _loop_vmap(info.batch_size, in_dims[4:], lambda *a: _DoubleBackward.apply(
            module, tape, given, n_u, *a), tensors)
