"""The compiled function: validation at the edge, one backend call per sequence."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from rnnc import backends, passes, philox, process, second_order, validate
from rnnc import precision as precision_module
from rnnc.device import Device, device_of, is_device
from rnnc.device_twin import DeviceTwin, routes_data, routes_tapes
from rnnc.dsl import Cell
from rnnc.dsl_random import draws_masks
from rnnc.errors import RnncPicklingError, RnncTypeError, RnncValueError
from rnnc.grads import NP, Grads, InputGrads, Tape, cotangent_env, cotangents
from rnnc.ir import Program, retype
from rnnc.layout import Layout, device_params
from rnnc.names import MASK, final_state, gradient
from rnnc.passes.autodiff import check_save_plans
from rnnc.printer import format_program, op_counts
from rnnc.settings import SECOND_ORDER_CHECK, check_option, fastest_backend, resolve_backend


class Function:
    """A cell compiled for one backend: inference, training forward and backward.

    ``reverse=True`` runs the cell over t = T-1, ..., 0 (see :func:`compile`); ``backend=None``
    is the default backend, which runs device data on a CUDA twin (see :func:`compile`)."""

    def __init__(self, cell: Cell, backend: str | None = None, *, optimize: bool = True,
                 check: bool | str | None = None, reverse: bool = False,
                 parallel_scan: bool | None = None, precision: str = "fp32",
                 **options: Any) -> None:
        if not isinstance(cell, Cell):
            raise RnncTypeError(f"compile() takes an rnnc.Cell, got {type(cell).__name__}")
        for flag, value in (("optimize", optimize), ("reverse", reverse),
                            ("parallel_scan", True if parallel_scan is None else parallel_scan)):
            if not isinstance(value, bool):
                raise RnncTypeError(f"{flag} must be True or False, got {value!r}")
        self._spec = (backend, dict(options))  # what a pickled function is rebuilt from
        backend = resolve_backend(backend, optimize)
        self.precision = precision_module.check(precision, backend)  # rnnc/precision.py
        self._device_twin = DeviceTwin.of(self._spec[0], optimize, cell, reverse,
                                          parallel_scan, check, self.precision)
        cell.check()
        self.cell = cell
        self.optimize = optimize
        self.reverse = reverse
        self.backend = backends.get(backend, **options, **(
            {"precision": self.precision} if backend == "cuda" else {}))
        # parallel-scan where the backend's linear_scan beats its loop, unless told otherwise
        self.parallel_scan = (getattr(self.backend, "parallel_scan", True)
                              if parallel_scan is None else parallel_scan)
        self._base = precision_module.mark(cell.program(reverse=reverse), self.precision)
        self._programs: dict[tuple[str, str, bool], Program] = {}
        self._runners: dict[tuple[str, str, bool], Any] = {}
        self._memory_checked: set[tuple] = set()  # (T, B, dtype, states given) in memory
        self._lock = process.Lock()
        self.inputs = cell.sizes("input")
        self.no_grad = tuple(n for n in self.inputs if n in cell.no_grad)  # grad=False inputs
        self.states = cell.sizes("state")
        self.params = cell.sizes("param")
        self.outputs = tuple(cell.outputs)
        self.draws_masks = draws_masks(self._base.args)  # rnnc.bernoulli: calls need seed=
        self._identity = self._base.fingerprint()  # structure with exact constants, not text
        prepared = passes.run_cached(self._identity, self._base, self.pipeline("prepare", False))
        self.layout = Layout(prepared.layout or Layout.identity(self.params).blocks, self.params)
        check = check_option(check)
        if check and optimize:
            from rnnc.check import check_function

            check_function(self, second_order=check == SECOND_ORDER_CHECK)

    # -- pickling: native code is not pickled; a loaded function builds it on first use
    def __getstate__(self) -> dict[str, Any]:
        try:
            pickle.dumps(self.cell)
        except Exception as err:  # noqa: BLE001 - pickle raises several kinds for one cause
            raise RnncPicklingError(
                f"cannot pickle the compiled function of cell {self.cell.name!r}: its cell does "
                f"not pickle ({err}); give c.param(init=...) a module-level function or a "
                f"number, not a lambda or a function defined inside another one") from err
        backend, options = self._spec
        return {"cell": self.cell, "backend": backend, "options": options,
                "optimize": self.optimize, "reverse": self.reverse,
                "parallel_scan": self.parallel_scan, "precision": self.precision}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cell"], state["backend"], optimize=state["optimize"], check=False,
                      reverse=state["reverse"], parallel_scan=state["parallel_scan"],
                      precision=state.get("precision", "fp32"), **state["options"])

    def pipeline(self, mode: str, lengths: bool) -> tuple[str, ...]:
        """The names of the passes that make ``mode``'s program, in order."""
        return passes.pipeline(mode, lengths, self.optimize, parallel_scan=self.parallel_scan)

    # -- programs
    def program(self, mode: str = "inference", dtype: str = "f32", lengths: bool = False,
                callback: passes.Callback | None = None) -> Program:
        """The optimized program for ``mode`` ("inference", "forward", "backward")."""
        if callback is not None:
            return passes.run(retype(self._base, dtype), self.pipeline(mode, lengths), callback)
        key = (mode, dtype, lengths)
        if key not in self._programs:
            self._programs[key] = passes.run_cached(self._identity, retype(self._base, dtype),
                                                    self.pipeline(mode, lengths))
        return self._programs[key]

    def runner(self, mode: str, dtype: str, masked: bool):
        """The backend's callable for ``mode``'s program, built once and kept."""
        key = (mode, dtype, masked)
        with self._lock:
            if key in self._runners:
                return self._runners[key]
        # Built outside the lock, so that a process forked while another thread compiles never
        # inherits it held; two threads racing here build the same code (the backend's code
        # cache makes the second cheap) and the first one stored wins.
        program = self.program(mode, dtype, masked)
        for writer, level in passes.save_writers(mode):
            check_save_plans(self.program(writer, dtype, masked), writer, program, mode, level)
        runner = self.backend.build(program, mode)
        with self._lock:
            return self._runners.setdefault(key, runner)

    def saved_names(self, mode: str, dtype: str, masked: bool) -> tuple[str, ...]:
        """The names the last autodiff of ``mode`` saves (``mode`` stacks or reads them)."""
        plans = self.program(mode, dtype, masked).saves
        return tuple(name for name, _ in plans[-1]) if plans else ()

    def ir(self, mode: str = "inference", dtype: str = "f32", lengths: bool = False) -> str:
        """The optimized program for ``mode`` as text."""
        return format_program(self.program(mode, dtype, lengths), f"{self.cell.name} {mode}")

    def op_counts(self, mode: str = "inference") -> dict[str, dict[str, int]]:
        """Node counts inside the loop body and outside it, by op name."""
        return op_counts(self.program(mode))

    def launch_report(self) -> list[dict[str, Any]]:
        """One row per program run so far and shape: how the CUDA backend launches it (path, how
        it was chosen, first call's tuning time, graph or not); empty on other backends."""
        with self._lock:
            runners = sorted(self._runners.items())
        return [{"program": mode, "dtype": dtype, "lengths": masked, **row}
                for (mode, dtype, masked), runner in runners
                for row in (runner.launch_report() if hasattr(runner, "launch_report") else ())]

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

    def _param_blocks(self, params: Any, dtype: str, device: Device | None = None
                      ) -> dict[str, np.ndarray]:
        if device is not None and (device.holds(params) or isinstance(params, Mapping) and any(
                device.holds(v) for v in params.values())):
            return device_params(self.layout, self.params, params, dtype, device)
        if is_device(params):
            raise RnncTypeError("the flat parameter buffer is a device array, but this call runs "
                                "on the host: pass the input sequence on the device too (with "
                                "backend='cuda'), or the parameters on the host")
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
    def _seed(self, seed: Any) -> int | None:
        """The call's seed, checked; required when the cell draws masks, else ignored."""
        if seed is None and self.draws_masks:
            raise RnncValueError(f"cell {self.cell.name!r} draws random masks (rnnc.bernoulli): "
                                 f"pass seed=<an integer in [0, 2**64)> to every call, e.g. "
                                 f"fn(x, params, seed=0); the same seed gives the same masks")
        return None if seed is None else philox.check_seed(seed)

    def _prepare(self, x: Any, params: Any, states: Any, lengths: Any, seed: Any = None):
        seed = self._seed(seed)
        # bfloat16 arrays are float32 from here on (a "bf16" function rounds its GEMM operands)
        x, params, states = precision_module.widen_call(self.precision, x, params, states)
        device = device_of(self.backend, x)
        xs, dtype, T, B = validate.sequences(self.inputs, x, device)
        precision_module.check_dtype(self.precision, dtype)
        validate.params_dtype(x, params, dtype)
        env: dict[str, np.ndarray] = dict(xs)
        env.update(self._param_blocks(params, dtype, device))
        given = validate.named_arrays("state", self.states, states, dtype, B, False, T=T,
                                      device=device)
        lens = validate.lengths(lengths, T, B)
        key = (T, B, dtype, tuple(given))  # a size once within memory is not computed again
        if key not in self._memory_checked:
            validate.call_memory(self._new_arrays(T, B, given), dtype, validate.physical_memory())
            self._memory_checked = {*tuple(self._memory_checked)[-63:], key}  # a bounded few
        zeros = np.zeros if device is None else device.zeros
        for name, shape in self.states.items():
            env[name] = given.get(name, zeros((B, *shape[1:]), NP[dtype]))
        if lens is not None:
            env[MASK] = validate.mask(lens, T, dtype)
        if self.draws_masks:
            env.update(philox.random_env(seed, T, B, NP[dtype]))
        return env, dtype, T, B, lens, seed, device

    @cached_property
    def _output_sizes(self) -> dict[str, int]:
        return {name: self.cell.graph.node(node).shape[-1]
                for name, node in self.cell.outputs.items()}

    def _new_arrays(self, T: int, B: int, given: Mapping[str, np.ndarray]
                    ) -> dict[str, tuple[tuple[int, ...], str]]:
        """The arrays any call allocates, at least: outputs, final states, omitted states."""
        return validate.new_arrays(self._output_sizes, self.states, self.draws_masks, T, B,
                                   given)

    def _split(self, res: Mapping[str, np.ndarray]):
        ys = {name: res[name] for name in self.outputs}
        return ys, {s: res[final_state(s)] for s in self.states}

    def _empty(self, env, dtype, B, device: Device | None):
        zeros = np.zeros if device is None else device.zeros
        ys = {n: zeros((0, B, self._output_sizes[n]), NP[dtype]) for n in self.outputs}
        return ys, {s: env[s].copy() for s in self.states}

    @staticmethod
    def _run(runner: Any, env: dict[str, Any], T: int, B: int, device: Device | None
             ) -> dict[str, Any]:
        """One backend call; a device call's results stay on the device."""
        if device is not None:
            return runner.on_device(env, {"T": T, "B": B})
        return runner(env, {"T": T, "B": B})

    @routes_data
    def __call__(self, x: Any, params: Any, states: Any = None, lengths: Any = None,
                 seed: Any = None):
        """Inference over a whole sequence: ``(outputs, final_states)``. ``seed`` (an int in
        [0, 2**64)) keys the masks of a cell that draws them (``rnnc.bernoulli``)."""
        env, dtype, T, B, lens, _, device = self._prepare(x, params, states, lengths, seed)
        if T == 0:
            return self._empty(env, dtype, B, device)
        run = self.runner("inference", dtype, lens is not None)
        return self._split(self._run(run, env, T, B, device))

    @routes_data
    def forward(self, x: Any, params: Any, states: Any = None, lengths: Any = None,
                seed: Any = None):
        """Training forward: ``(outputs, final_states, tape)``; the tape keeps ``seed``, so
        backward regenerates the same masks."""
        env, dtype, T, B, lens, seed, device = self._prepare(x, params, states, lengths, seed)
        if T == 0:
            ys, st = self._empty(env, dtype, B, device)
            return ys, st, Tape(self, dtype, 0, B, env, lens, seed, device)
        res = self._run(self.runner("forward", dtype, lens is not None), env, T, B, device)
        ys, st = self._split(res)
        saved = {n: res[n] for n in self.saved_names("forward", dtype, lens is not None)}
        for arr in saved.values():  # backward may run many times: nothing may change them
            if isinstance(arr, np.ndarray):  # (CuPy arrays have no read-only flag)
                arr.flags.writeable = False
        env.update(saved)
        return ys, st, Tape(self, dtype, T, B, env, lens, seed, device)

    @routes_tapes
    def backward(self, tape: Tape, d_outputs: Mapping[str, Any] | None = None,
                 d_states: Mapping[str, Any] | None = None) -> Grads:
        """Gradients of a scalar loss given its gradients w.r.t. outputs and final states."""
        if not isinstance(tape, Tape):
            raise RnncTypeError(f"backward() takes the tape from forward(), got "
                                f"{type(tape).__name__}")
        if tape.owner is not self:
            raise RnncValueError("this tape was recorded by another compiled function")
        d_out, d_st = self.upstream(tape, d_outputs, d_states)
        if tape.T == 0:
            return self.zero_grads(tape, d_st)
        env = {**tape.env, **cotangent_env(d_out, d_st)}
        res = self._run(self.runner("backward", tape.dtype, tape.lengths is not None), env,
                        tape.T, tape.B, tape.device)
        return self.sum_grads(tape, (res,), res)

    def upstream(self, tape: Tape, d_outputs: Any, d_states: Any
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The cotangents of the outputs and of the final states (omitted ones zero)."""
        out_shapes = {n: ("T", "B", self._output_sizes[n]) for n in self.outputs}
        args = (tape.dtype, tape.T, tape.B, tape.device)
        return (cotangents("output gradient", out_shapes, d_outputs, *args),
                cotangents("state gradient", self.states, d_states, *args))

    def sum_grads(self, tape: Tape, results: tuple[Mapping[str, np.ndarray], ...],
                  states: Mapping[str, np.ndarray]) -> Grads:
        """Grads summed over backward ``results``: a parameter or input the outputs do not
        depend on has no gradient in any of them, so it is zero; ``states`` holds those of the
        initial states."""
        dt = NP[tape.dtype]
        zeros = np.zeros if tape.device is None else tape.device.zeros
        flat = zeros(self.layout.size, dt)
        for name, view in self.layout.block_views(flat).items():
            for res in results:
                if gradient(name) in res:
                    view += res[gradient(name)]
        gx = {}
        for n, s in self.inputs.items():
            terms = [r[gradient(n)] for r in results if gradient(n) in r]
            if n not in self.no_grad:
                gx[n] = terms[0] if len(terms) == 1 else \
                    sum(terms, zeros((tape.T, tape.B, s[-1]), dt))
        x = InputGrads(gx, self.no_grad) if len(self.inputs) > 1 else \
            next(iter(gx.values()), None)
        return Grads(x, self.layout.unpack(flat),
                     {s: states[gradient(s)] for s in self.states}, flat)

    def zero_grads(self, tape: Tape, d_st: dict[str, np.ndarray]) -> Grads:
        """The gradients of an empty sequence: zero, and the initial states' are ``d_st``."""
        return self.sum_grads(tape, (), {gradient(s): v.copy() for s, v in d_st.items()})

    # -- second order
    @routes_tapes
    def double_backward(self, tape: Tape, d_outputs: Mapping[str, Any] | None,
                        d_states: Mapping[str, Any] | None, g_x: Mapping[str, Any] | None,
                        g_params: Mapping[str, Any] | None, g_states: Mapping[str, Any] | None
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Grads]:
        """The derivative of ``backward(tape, d_outputs, d_states)``: see
        :func:`rnnc.second_order.double_backward`."""
        return second_order.double_backward(self, tape, d_outputs, d_states, g_x, g_params,
                                            g_states)


def compile(cell: Cell, backend: str | None = None, *, optimize: bool = True,  # noqa: A001
            check: bool | str | None = None, reverse: bool = False,
            parallel_scan: bool | None = None, precision: str = "fp32",
            **options: Any) -> Function:
    """Compile ``cell`` for ``backend`` ("numpy", "llvm" or "cuda"; None: the default).

    The default is the fastest backend for the data: host arrays run on "llvm" (else "numpy"
    where LLVM cannot run here), a call on device arrays (CuPy, CUDA tensors) on the cell
    compiled for "cuda", built on first use (docs/backends.md). "numpy" is for debugging.

    ``optimize=False`` (NumPy backend only) interprets the traced program with no optimization
    passes: the oracle that the compiler is tested against. ``check=True`` (or the environment
    variable ``RNNC_CHECK=1``) runs the compiled function once on small random inputs against
    that oracle, inference, training forward and backward, with and without lengths, in float64
    and float32 (each against the oracle in the same dtype), and raises
    :class:`rnnc.CheckError` naming the first pass whose output disagrees (or the backend).
    ``check="second-order"`` (or ``RNNC_CHECK=second-order``) also checks
    :meth:`Function.double_backward`. A cell whose float32 results differ from float64 beyond
    float32 rounding (a rounding trick, a cancellation) gets a :class:`rnnc.CheckWarning` that
    says so, not an error.

    ``reverse=True`` runs the cell over t = T-1, ..., 0 (a layer's reverse direction), with
    inputs and outputs in their natural time order. With ``lengths`` each sequence starts at
    its own last step: steps t >= length keep the initial states and output zero.

    ``parallel_scan`` runs the pass of that name (carries linear in themselves become a
    ``linear_scan`` over time): on by default for "numpy" and "cuda"; off by default for "llvm",
    whose scan is slower than its fused loop on one or two cores (docs/passes.md).
    ``precision``: "fp32", "bf16" (bfloat16 GEMM operands, float32 sums and the rest float32;
    float32 outputs), "tf32" on "cuda" only (docs/precision.md)."""
    return Function(cell, backend, optimize=optimize, check=check, reverse=reverse,
                    parallel_scan=parallel_scan, precision=precision, **options)


def backend_pipeline(mode: str, backend: str | None = None) -> tuple[str, ...]:
    """The passes ``rnnc.compile(cell, backend)`` runs for ``mode`` (without lengths) unless
    told otherwise: the mode's pipeline, less parallel-scan (and its follow-ups) where the
    backend leaves it off."""
    name = fastest_backend() if backend is None else backend
    return passes.pipeline(mode, parallel_scan=backends.runs_parallel_scan(name))


def dump(cell: Cell, after: str = "all", mode: str = "inference", dtype: str = "f32",
         backend: str | None = None) -> str:
    """The program as text after the pass ``after`` (or after every pass with "all"), through
    the passes that ``backend`` runs (None: the default backend, as in :func:`compile`)."""
    base = cell.program()
    names = backend_pipeline(mode, backend)
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
