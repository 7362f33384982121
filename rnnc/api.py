"""The compiled function: validation at the edge, one backend call per sequence."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from rnnc import backends, passes, validate
from rnnc.dsl import Cell, final_name
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.fingerprint import fingerprint
from rnnc.ir import Program, retype
from rnnc.layout import Layout
from rnnc.names import MASK
from rnnc.printer import format_program

NP = {"f32": np.float32, "f64": np.float64}


@dataclass
class Tape:
    """What a training forward saved for backward. Usable any number of times.

    Like PyTorch's saved tensors, a tape refers to the caller's input and parameter arrays
    (the values rnnc saved itself are read-only): changing those in place between forward
    and backward gives wrong gradients."""

    owner: Function
    dtype: str
    T: int
    B: int
    env: dict[str, np.ndarray]
    lengths: np.ndarray | None


@dataclass
class Grads:
    """Gradients: ``x`` (an array, or a dict for multi-input cells), ``params``, ``states``."""

    x: Any
    params: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    flat: np.ndarray | None = None


class Function:
    """A cell compiled for one backend: inference, training forward and backward."""

    def __init__(self, cell: Cell, backend: str = "numpy", *, optimize: bool = True,
                 check: bool | None = None, **options: Any) -> None:
        if not isinstance(cell, Cell):
            raise RnncTypeError(f"compile() takes an rnnc.Cell, got {type(cell).__name__}")
        if not isinstance(optimize, bool):
            raise RnncTypeError(f"optimize must be True or False, got {optimize!r}")
        if not optimize and backend != "numpy":
            raise RnncValueError(f"optimize=False is the NumPy oracle: it needs backend='numpy', "
                                 f"got backend={backend!r}")
        cell.check()
        self.cell = cell
        self.optimize = optimize
        validate.backend_options(backend, options)
        self.backend = backends.get(backend, **options)
        self._base = cell.program()
        self._programs: dict[tuple[str, str, bool], Program] = {}
        self._runners: dict[tuple[str, str, bool], Any] = {}
        self._lock = threading.Lock()
        self.inputs = cell.sizes("input")
        self.states = cell.sizes("state")
        self.params = cell.sizes("param")
        self.outputs = tuple(cell.outputs)
        self._identity = fingerprint(self._base)  # structure with exact constants, not text
        prepared = _optimized(self._identity, self._base, self._pipeline("prepare", False))
        self.layout = Layout(
            [b for b in prepared.meta.get("layout", ())] or Layout.identity(self.params).blocks,
            self.params)
        if check is None:
            check = os.environ.get("RNNC_CHECK", "").strip() not in ("", "0")
        if check and optimize:
            from rnnc.check import check_function

            check_function(self)

    def _pipeline(self, mode: str, lengths: bool) -> tuple[str, ...]:
        return passes.pipeline(mode, lengths, self.optimize)

    # -- programs
    def program(self, mode: str = "inference", dtype: str = "f32", lengths: bool = False,
                callback: passes.Callback | None = None) -> Program:
        """The optimized program for ``mode`` ("inference", "forward", "backward")."""
        if callback is not None:
            return passes.run(retype(self._base, dtype), self._pipeline(mode, lengths), callback)
        key = (mode, dtype, lengths)
        if key not in self._programs:
            self._programs[key] = _optimized(self._identity, retype(self._base, dtype),
                                             self._pipeline(mode, lengths))
        return self._programs[key]

    def _runner(self, mode: str, dtype: str, masked: bool):
        key = (mode, dtype, masked)
        with self._lock:
            if key in self._runners:
                return self._runners[key]
        # Built outside the lock, so that a process forked while another thread compiles never
        # inherits it held; two threads racing here build the same code (the backend's code
        # cache makes the second cheap) and the first one stored wins.
        runner = self.backend.build(self.program(mode, dtype, masked))
        with self._lock:
            return self._runners.setdefault(key, runner)

    def ir(self, mode: str = "inference", dtype: str = "f32", lengths: bool = False) -> str:
        """The optimized program for ``mode`` as text."""
        return format_program(self.program(mode, dtype, lengths), f"{self.cell.name} {mode}")

    def op_counts(self, mode: str = "inference") -> dict[str, dict[str, int]]:
        """Node counts inside the loop body and outside it, by op name."""
        p = self.program(mode)
        counts: dict[str, dict[str, int]] = {"loop": {}, "outside": {}}
        for where, graphs in (("loop", (p.scan.body,)), ("outside", (p.pre, p.post))):
            for g in graphs:
                for node in g.nodes():
                    if node.op.name in ("arg", "get", "constant"):
                        continue
                    counts[where][node.op.name] = counts[where].get(node.op.name, 0) + 1
        return counts

    # -- parameters
    def pack(self, params: Mapping[str, np.ndarray]) -> np.ndarray:
        """Copy named parameters into one new flat buffer."""
        first = next(iter(params.values()), None) if isinstance(params, Mapping) else None
        dtype = "f64" if first is not None and np.asarray(first).dtype == np.float64 else "f32"
        params = validate.named_arrays("parameter", self.params, params, dtype, None, True)
        return self.layout.pack(params, NP[dtype])

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Named views into a flat buffer."""
        return self.layout.unpack(flat)

    def _param_blocks(self, params: Any, dtype: str) -> dict[str, np.ndarray]:
        if isinstance(params, np.ndarray):
            self.layout.check_flat(params)
            params = validate.native(params)
            if validate.float_dtype(params, "flat parameter buffer") != dtype:
                raise RnncTypeError(f"flat parameter buffer is {params.dtype}, the input is "
                                    f"{np.dtype(NP[dtype])}: convert one of them with .astype")
            return self.layout.block_views(validate.contiguous(params, "flat parameter buffer"))
        params = validate.named_arrays("parameter", self.params, params, dtype, None, True)
        return self.layout.block_views(self.layout.pack(params, NP[dtype]))

    # -- running
    def _prepare(self, x: Any, params: Any, states: Any, lengths: Any):
        xs, dtype, T, B = validate.sequences(self.inputs, x)
        validate.params_dtype(x, params, dtype)
        env: dict[str, np.ndarray] = dict(xs)
        env.update(self._param_blocks(params, dtype))
        given = validate.named_arrays("state", self.states, states, dtype, B, False, T=T)
        lens = validate.lengths(lengths, T, B)
        validate.call_memory(self._new_arrays(T, B, given), dtype, validate.physical_memory())
        for name, shape in self.states.items():
            env[name] = given.get(name, np.zeros((B, shape[-1]), NP[dtype]))
        if lens is not None:
            env[MASK] = validate.mask(lens, T, dtype)
        return env, dtype, T, B, lens

    @cached_property
    def _output_sizes(self) -> dict[str, int]:
        return {name: self.cell.graph.node(node).shape[-1]
                for name, node in self.cell.outputs.items()}

    def _new_arrays(self, T: int, B: int, given: Mapping[str, np.ndarray]
                    ) -> dict[str, tuple[tuple[int, ...], str]]:
        """The arrays any call allocates, at least: outputs, final states, omitted states."""
        out = {}
        for name, width in self._output_sizes.items():
            out[f"output {name!r}"] = ((T, B, width), f"T={T}, B={B}, output size {width}")
        for name, shape in self.states.items():
            why = f"B={B}, state {name!r} of size {shape[-1]}"
            out[f"final state {name!r}"] = ((B, shape[-1]), why)
            if name not in given:
                out[f"initial state {name!r}"] = ((B, shape[-1]), why)
        return out

    def _split(self, res: Mapping[str, np.ndarray]):
        ys = {name: res[name] for name in self.outputs}
        return ys, {s: res[final_name(s)] for s in self.states}

    def _empty(self, env, dtype, B):
        ys = {n: np.zeros((0, B, self._output_sizes[n]),
                          NP[dtype]) for n in self.outputs}
        return ys, {s: env[s].copy() for s in self.states}

    def __call__(self, x: Any, params: Any, states: Any = None, lengths: Any = None):
        """Inference over a whole sequence: ``(outputs, final_states)``."""
        env, dtype, T, B, lens = self._prepare(x, params, states, lengths)
        if T == 0:
            return self._empty(env, dtype, B)
        run = self._runner("inference", dtype, lens is not None)
        return self._split(run(env, {"T": T, "B": B}))

    def forward(self, x: Any, params: Any, states: Any = None, lengths: Any = None):
        """Training forward: ``(outputs, final_states, tape)``."""
        env, dtype, T, B, lens = self._prepare(x, params, states, lengths)
        if T == 0:
            ys, st = self._empty(env, dtype, B)
            return ys, st, Tape(self, dtype, 0, B, env, lens)
        res = self._runner("forward", dtype, lens is not None)(env, {"T": T, "B": B})
        ys, st = self._split(res)
        program = self.program("forward", dtype, lens is not None)
        saved = {n: res[n] for n in program.results if n not in ys and n not in
                 {final_name(s) for s in self.states}}
        for arr in saved.values():  # backward may run many times: nothing may change them
            arr.flags.writeable = False
        env.update(saved)
        return ys, st, Tape(self, dtype, T, B, env, lens)

    def backward(self, tape: Tape, d_outputs: Mapping[str, Any] | None = None,
                 d_states: Mapping[str, Any] | None = None) -> Grads:
        """Gradients of a scalar loss given its gradients w.r.t. outputs and final states."""
        if not isinstance(tape, Tape):
            raise RnncTypeError(f"backward() takes the tape from forward(), got "
                                f"{type(tape).__name__}")
        if tape.owner is not self:
            raise RnncValueError("this tape was recorded by another compiled function")
        dtype, T, B = tape.dtype, tape.T, tape.B
        out_shapes = {n: ("T", "B", self._output_sizes[n])
                      for n in self.outputs}
        d_out = _cotangents("output gradient", out_shapes, d_outputs, dtype, T, B)
        d_st = _cotangents("state gradient", self.states, d_states, dtype, T, B)
        if T == 0:
            return self._zero_grads(tape, d_st)
        env = dict(tape.env)
        env.update({f"d.{n}": v for n, v in d_out.items()})
        env.update({f"d.{final_name(n)}": v for n, v in d_st.items()})
        res = self._runner("backward", dtype, tape.lengths is not None)(env, {"T": T, "B": B})
        # A parameter or input the outputs do not depend on has no gradient node: zero.
        flat = np.zeros(self.layout.size, NP[dtype])
        for name, view in self.layout.block_views(flat).items():
            if f"grad.{name}" in res:
                view[...] = res[f"grad.{name}"]
        gx = {n: res.get(f"grad.{n}", np.zeros((T, B, s[-1]), NP[dtype]))
              for n, s in self.inputs.items()}
        return Grads(gx if len(gx) > 1 else next(iter(gx.values())),
                     self.layout.unpack(flat), {s: res[f"grad.{s}"] for s in self.states}, flat)

    def _zero_grads(self, tape: Tape, d_st: dict[str, np.ndarray]) -> Grads:
        dt = NP[tape.dtype]
        gx = {n: np.zeros((0, tape.B, s[-1]), dt) for n, s in self.inputs.items()}
        flat = np.zeros(self.layout.size, dt)
        return Grads(gx if len(gx) > 1 else next(iter(gx.values())), self.layout.unpack(flat),
                     {s: d_st[s].copy() for s in self.states}, flat)

    # -- second order
    def double_backward(self, tape: Tape, d_outputs: Mapping[str, Any] | None,
                        d_states: Mapping[str, Any] | None, g_x: Mapping[str, Any] | None,
                        g_params: Mapping[str, Any] | None, g_states: Mapping[str, Any] | None
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Grads]:
        """The derivative of ``backward(tape, d_outputs, d_states)``.

        ``g_x`` (by input name), ``g_params`` and ``g_states`` are cotangents of the
        ``Grads`` that backward returns (omitted entries are zero). Returns the cotangents of
        backward's arguments: ``(of d_outputs, of d_states, Grads)``, where ``Grads`` holds
        those of the forward's ``x``, ``params`` and initial ``states``. The backward reads
        them directly and through the values the forward saved, so this runs the backward of
        the backward program ("backward.backward"), then the forward's backward with the
        saved values' cotangents ("forward.backward"), each after the training forward
        ("backward.forward", "forward.forward") that saves what it reads.
        """
        if not isinstance(tape, Tape) or tape.owner is not self:
            raise RnncValueError("double_backward() takes a tape from this function's forward()")
        dtype, T, B = tape.dtype, tape.T, tape.B
        outs = {n: ("T", "B", self._output_sizes[n])
                for n in self.outputs}
        d_out = _cotangents("output gradient", outs, d_outputs, dtype, T, B)
        d_st = _cotangents("state gradient", self.states, d_states, dtype, T, B)
        u_x = _cotangents("input gradient cotangent",
                          {n: ("T", "B", s[-1]) for n, s in self.inputs.items()}, g_x, dtype,
                          T, B)
        u_st = _cotangents("state gradient cotangent", self.states, g_states, dtype, T, B)
        u_flat = self.layout.pack({n: np.asarray(g_params[n]) if g_params and n in g_params
                                   else np.zeros(s, NP[dtype]) for n, s in self.params.items()},
                                  NP[dtype])
        if T == 0:  # backward passed d_states through: so does its derivative
            zero = self._zero_grads(tape, {s: np.zeros_like(v) for s, v in d_st.items()})
            return ({n: np.zeros_like(v) for n, v in d_out.items()}, u_st, zero)
        masked, dims = tape.lengths is not None, {"T": T, "B": B}
        env = dict(tape.env)
        env.update({f"d.{n}": v for n, v in d_out.items()})
        env.update({f"d.{final_name(n)}": v for n, v in d_st.items()})
        env.update(_saves(self._runner("backward.forward", dtype, masked)(env, dims), env))
        env.update({f"d.grad.{n}": v for n, v in u_x.items()})
        env.update({f"d.grad.{n}": v for n, v in u_st.items()})
        env.update({f"d.grad.{n}": v for n, v in self.layout.block_views(u_flat).items()})
        direct = self._runner("backward.backward", dtype, masked)(env, dims)
        # The saved values' cotangents flow back to x, params and states through the forward.
        env = dict(tape.env)
        env.update({f"d.{n}": np.zeros_like(v) for n, v in d_out.items()})
        env.update({f"d.{final_name(n)}": np.zeros_like(v) for n, v in d_st.items()})
        env.update({f"d.{n}": direct.get(f"grad.{n}", np.zeros_like(v))
                    for n, v in tape.env.items() if n.startswith("save.")})
        env.update(_saves(self._runner("forward.forward", dtype, masked)(tape.env, dims), env))
        through = self._runner("forward.backward", dtype, masked)(env, dims)
        flat = np.zeros(self.layout.size, NP[dtype])
        for name, view in self.layout.block_views(flat).items():
            for res in (direct, through):
                if f"grad.{name}" in res:
                    view += res[f"grad.{name}"]
        gx = {n: sum((r[f"grad.{n}"] for r in (direct, through) if f"grad.{n}" in r),
                     np.zeros((T, B, s[-1]), NP[dtype])) for n, s in self.inputs.items()}
        grads = Grads(gx if len(gx) > 1 else next(iter(gx.values())), self.layout.unpack(flat),
                      {s: through[f"grad.{s}"] for s in self.states}, flat)
        dd_out = {n: direct.get(f"grad.d.{n}", np.zeros_like(v)) for n, v in d_out.items()}
        dd_st = {s: direct.get(f"grad.d.{final_name(s)}", np.zeros_like(v))
                 for s, v in d_st.items()}
        return dd_out, dd_st, grads


def _saves(results: Mapping[str, np.ndarray], env: Mapping[str, np.ndarray]
           ) -> dict[str, np.ndarray]:
    """The ``save.N`` of a second-order training forward that ``env`` does not hold yet."""
    return {n: v for n, v in results.items() if n.startswith("save.") and n not in env}


_OPTIMIZED: OrderedDict[tuple, Program] = OrderedDict()
_OPTIMIZED_LOCK = threading.Lock()


def _optimized(identity: str, program: Program, names: tuple[str, ...]) -> Program:
    """``program`` after the passes ``names``, shared by every function of the same traced
    program, whose :func:`~rnnc.fingerprint.fingerprint` is ``identity`` (passes are pure and
    deterministic, and nothing mutates an optimized program)."""
    key = (identity, program.dtype, names)
    with _OPTIMIZED_LOCK:
        if key in _OPTIMIZED:
            _OPTIMIZED.move_to_end(key)
            return _OPTIMIZED[key]
    result = passes.run(program, names)
    with _OPTIMIZED_LOCK:
        _OPTIMIZED[key] = result
        while len(_OPTIMIZED) > 128:
            _OPTIMIZED.popitem(last=False)
    return result


def _cotangents(kind: str, shapes: Mapping[str, tuple], given: Any, dtype: str, T: int, B: int
                ) -> dict[str, np.ndarray]:
    """Upstream gradients by name; omitted entries are zero."""
    out = validate.named_arrays(kind, {n: tuple(T if d == "T" else d for d in s)
                                       for n, s in shapes.items()}, given, dtype, B, False)
    for name, shape in shapes.items():
        if name not in out:
            out[name] = np.zeros(tuple(T if d == "T" else B if d == "B" else d for d in shape),
                                 NP[dtype])
    return out


def compile(cell: Cell, backend: str = "numpy", *, optimize: bool = True,  # noqa: A001
            check: bool | None = None, **options: Any) -> Function:
    """Compile ``cell`` for ``backend`` ("numpy", "llvm" or "cuda").

    ``optimize=False`` (NumPy backend only) interprets the traced program with no optimization
    passes: the oracle that the compiler is tested against. ``check=True`` (or the environment
    variable ``RNNC_CHECK=1``) runs the compiled function once on small random inputs against
    that oracle, inference, training forward and backward, with and without lengths, and raises
    :class:`rnnc.CheckError` naming the first pass whose output disagrees."""
    return Function(cell, backend, optimize=optimize, check=check, **options)


def dump(cell: Cell, after: str = "all", mode: str = "inference", dtype: str = "f32") -> str:
    """The program as text after the pass ``after`` (or after every pass with "all")."""
    base = cell.program()
    names = passes.pipeline(mode)
    if after not in ("all", "none") and after not in names:
        raise RnncValueError(f"--after must be a pass of the {mode} pipeline ({', '.join(names)}) "
                             f"or 'all', got {after!r}")
    chunks = [format_program(base, f"{cell.name} {mode}: traced")] if after == "all" else []

    def show(name: str, program: Program, seconds: float) -> None:
        if after in ("all", name):
            chunks.append(format_program(program, f"{cell.name} {mode}: after {name}"))

    passes.run(retype(base, dtype), names, show)
    if after == "none":
        chunks.append(format_program(base, f"{cell.name} {mode}: traced"))
    return "\n\n".join(chunks)
