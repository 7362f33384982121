"""Random masks: Philox4x32-10, ``rnnc.bernoulli`` on every backend, seeds at every call.

The generator is checked against Random123's published known answers; every backend's masks
against ``rnnc.philox.mask`` bit for bit, in float32 and float64; gradients through cells that
draw masks against central differences with the seed fixed; and the save plans of training
programs for masks (backward draws them again instead of saving them).
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import ops, passes, philox
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.ptx import available_compiler, compile_ptx
from rnnc.ir import FUSED
from tests.numeric import central_difference

try:
    import llvmlite  # noqa: F401

    BACKENDS = [("numpy", {}), ("llvm", {}), ("cuda", {"emulate": True})]
except ImportError:
    BACKENDS = [("numpy", {}), ("cuda", {"emulate": True})]
IDS = [name for name, _ in BACKENDS]

# Random123's kat_vectors for philox4x32_10: counter, key, the four output words.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,words", KNOWN_ANSWERS, ids=["zeros", "ones", "pi"])
def test_philox_matches_random123_known_answers(counter, key, words) -> None:
    assert tuple(int(w) for w in philox.philox4x32(counter, key)) == words
    # Vectorized: the same answer in every element of a broadcast counter.
    wide = philox.philox4x32((np.full(5, counter[0], np.uint32),) + counter[1:], key)
    assert all((w == want).all() for w, want in zip(wide, words, strict=True))


def test_threshold_and_the_extreme_probabilities() -> None:
    assert philox.threshold(0.0) == 0 and philox.threshold(1.0) == 2**32
    assert philox.threshold(0.25) == 2**30
    assert philox.mask(7, 0, 4, 8, 0.0, 0).sum() == 0
    assert philox.mask(7, 0, 4, 8, 1.0, 0).min() == 1


def cell_of_masks(per_step: float = 0.3, per_sequence: float = 0.6) -> rnnc.Cell:
    """Outputs three masks: per step (two streams, the second on x's shape) and per sequence."""
    c = rnnc.Cell("masks")
    x = c.input("x", 3)
    h = c.state("h", 5)
    W = c.param("W", (3, 5))
    m = rnnc.bernoulli(per_step, like=h)
    n = rnnc.bernoulli(0.5, like=x)
    s = rnnc.bernoulli(per_sequence, like=h, per="sequence")
    c.update(h=rnnc.tanh(x @ W + h * m))
    c.output("m", m)
    c.output("n", n)
    c.output("s", s)
    return c


def expected_masks(seed: int, T: int, B: int) -> dict[str, np.ndarray]:
    return {"m": np.stack([philox.mask(seed, t, B, 5, 0.3, 0) for t in range(T)]),
            "n": np.stack([philox.mask(seed, t, B, 3, 0.5, 1) for t in range(T)]),
            "s": np.stack([philox.mask(seed, 0, B, 5, 0.6, 2, "sequence")] * T)}


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_masks_are_the_reference_bits_on_every_backend(backend, options, dtype, reverse) -> None:
    """Step t draws with counter word t, the real time index, also when the scan runs
    backwards; masks are exact, so every backend and dtype agrees bit for bit."""
    T, B, seed = 5, 3, 2**63 + 12345
    cell = cell_of_masks()
    fn = rnnc.compile(cell, backend=backend, reverse=reverse, **options)
    x = np.random.default_rng(0).standard_normal((T, B, 3)).astype(dtype)
    ys, _ = fn(x, cell.init_params(dtype=dtype), seed=seed)
    for name, want in expected_masks(seed, T, B).items():
        assert ys[name].dtype == dtype
        np.testing.assert_array_equal(ys[name], want, err_msg=name)


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_training_forward_draws_the_inference_masks(backend, options) -> None:
    T, B = 4, 2
    cell = cell_of_masks()
    fn = rnnc.compile(cell, backend=backend, **options)
    x = np.random.default_rng(1).standard_normal((T, B, 3))
    p = cell.init_params(dtype=np.float64)
    ys, st, tape = fn.forward(x, p, seed=99)
    assert tape.seed == 99
    for name, want in expected_masks(99, T, B).items():
        np.testing.assert_array_equal(ys[name], want, err_msg=name)
    np.testing.assert_allclose(st["h"], fn(x, p, seed=99)[1]["h"], rtol=1e-12)


def test_a_replayed_cuda_program_takes_each_call_s_seed() -> None:
    """graph=True keeps buffers and replays the steps: rng.key and rng.counter are inputs
    copied in at every call, so each call draws its own seed's masks."""
    T, B = 3, 2
    cell = cell_of_masks()
    fn = rnnc.compile(cell, backend="cuda", emulate=True, graph=True)
    x, p = np.zeros((T, B, 3), np.float32), cell.init_params()
    for seed in (1, 2, 1):
        ys, _ = fn(x, p, seed=seed)
        np.testing.assert_array_equal(ys["m"], expected_masks(seed, T, B)["m"])


def test_seeds_streams_and_keep_rate() -> None:
    """Two seeds differ, two call sites differ, a mask per sequence repeats over steps, and
    the fraction of ones is near p."""
    T, B, n = 8, 64, 64
    c = rnnc.Cell("rate")
    x = c.input("x", n)
    h = c.state("h", n)
    c.update(h=h)
    c.output("a", rnnc.bernoulli(0.3, like=h))
    c.output("b", rnnc.bernoulli(0.3, like=h))
    c.output("s", rnnc.bernoulli(0.8, like=x, per="sequence"))
    fn = rnnc.compile(c, backend="numpy")
    xs = np.zeros((T, B, n))
    one, _ = fn(xs, {}, seed=1)
    two, _ = fn(xs, {}, seed=2)
    assert not np.array_equal(one["a"], two["a"])
    assert not np.array_equal(one["a"], one["b"])
    assert not np.array_equal(one["a"][0], one["a"][1])
    assert all(np.array_equal(one["s"][0], one["s"][t]) for t in range(T))
    # T*B*n = 32768 draws: the standard deviation of the rate is 0.0025 at p = 0.3.
    for name, p in (("a", 0.3), ("b", 0.3)):
        assert abs(one[name].mean() - p) < 0.01, (name, one[name].mean())
    assert abs(one["s"][0].mean() - 0.8) < 0.02


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_masks_with_lengths(backend, options) -> None:
    """With lengths the masks inside each sequence are the same as without."""
    T, B = 4, 3
    cell = cell_of_masks()
    fn = rnnc.compile(cell, backend=backend, **options)
    x = np.random.default_rng(2).standard_normal((T, B, 3)).astype(np.float32)
    lengths = np.array([4, 1, 3])
    ys, _ = fn(x, cell.init_params(), lengths=lengths, seed=5)
    live = (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    for name, want in expected_masks(5, T, B).items():
        np.testing.assert_array_equal(ys[name], np.where(live, want, 0.0), err_msg=name)


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_high_halves_of_the_step_row_and_seed_words(backend, options) -> None:
    """Steps and rows past 2**16 (their high 16-bit halves) reach every backend's counter:
    the program runs on a hand-made rng.counter holding such indices."""
    from rnnc.backends import get

    cell = cell_of_masks()
    program = rnnc.compile(cell, backend="numpy").program("inference", "f64")
    seed, t = 2**64 - 3, np.array([[70_000, 70_000], [2**31 + 5, 2**31 + 5]])
    rows = np.array([[3, 65_536 + 7], [2**20, 1]])
    env = philox.random_env(seed, 2, 2, np.float64)
    env["rng.counter"] = np.stack([*philox.halves(t), *philox.halves(rows)], -1).astype(float)
    env.update(x=np.zeros((2, 2, 3)), h=np.zeros((2, 5)), **cell.init_params(dtype=np.float64))
    got = get(backend, **options).build(program, "inference")(env, {"T": 2, "B": 2})
    key = philox.key_words(seed)
    np.testing.assert_array_equal(got["m"], philox.mask_bits(key, t, rows, 5, 0.3, 0, "step"))
    np.testing.assert_array_equal(got["s"],
                                  philox.mask_bits(key, t, rows, 5, 0.6, 2, "sequence"))


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_a_mask_in_a_carry_linear_in_itself(backend, options) -> None:
    """Zoneout of a state whose candidate reads no state: the carry is linear in itself, so
    the whole recurrence may run over all steps at once (parallel-scan), masks included."""
    c = rnnc.Cell("linear_zoneout")
    x, h = c.input("x", 3), c.state("h", 4)
    W = c.param("W", (3, 4))
    c.update(h=rnnc.where(rnnc.bernoulli(0.3, like=h), h, rnnc.tanh(x @ W)))
    c.output("y", h)
    xs = np.random.default_rng(8).standard_normal((5, 3, 3))
    p = c.init_params(dtype=np.float64)
    oracle, fn = rnnc.compile(c, optimize=False), rnnc.compile(c, backend=backend, **options)
    np.testing.assert_allclose(fn(xs, p, seed=9)[0]["y"], oracle(xs, p, seed=9)[0]["y"],
                               rtol=1e-12, atol=1e-14)
    dy = {"y": np.random.default_rng(9).standard_normal((5, 3, 4))}
    got = fn.backward(fn.forward(xs, p, seed=9)[2], dy)
    want = oracle.backward(oracle.forward(xs, p, seed=9)[2], dy)
    np.testing.assert_allclose(got.params["W"], want.params["W"], rtol=1e-10, atol=1e-12)


def test_the_reference_means_the_same_over_all_steps_at_once() -> None:
    """A row's mask depends on its own counter row only: [T,B,4] gives the per-step masks."""
    env = philox.random_env(5, 3, 4, np.float64)
    attrs = {"p": 0.4, "per": "step", "size": 6, "stream": 2}
    whole = ops.bernoulli.ref(env["rng.key"], env["rng.counter"], **attrs)
    steps = [ops.bernoulli.ref(env["rng.key"], env["rng.counter"][t], **attrs) for t in range(3)]
    np.testing.assert_array_equal(whole, np.stack(steps))
    np.testing.assert_array_equal(steps[1], philox.mask(5, 1, 4, 6, 0.4, 2))


# ---------------------------------------------------------------- errors


def test_a_cell_that_draws_masks_needs_a_seed() -> None:
    fn = rnnc.compile(cell_of_masks(), backend="numpy")
    x = np.zeros((2, 1, 3), np.float32)
    p = fn.cell.init_params()
    assert fn.draws_masks
    with pytest.raises(rnnc.RnncValueError, match=r"draws random masks.*seed="):
        fn(x, p)
    with pytest.raises(rnnc.RnncValueError, match="seed="):
        fn.forward(x, p)
    for bad in (-1, 2**64):
        with pytest.raises(rnnc.RnncValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
            fn(x, p, seed=bad)
    for bad in (1.5, "7", True):
        with pytest.raises(rnnc.RnncTypeError, match="seed must be an integer"):
            fn(x, p, seed=bad)


def test_a_seed_on_a_cell_without_masks_is_ignored() -> None:
    cell = rnnc.cells.rnn(3, 4)
    fn = rnnc.compile(cell, backend="numpy")
    x = np.random.default_rng(3).standard_normal((3, 2, 3)).astype(np.float32)
    p = cell.init_params()
    assert not fn.draws_masks
    plain, _ = fn(x, p)
    seeded, _ = fn(x, p, seed=42)
    np.testing.assert_array_equal(plain["y"], seeded["y"])
    with pytest.raises(rnnc.RnncTypeError, match="seed must be an integer"):
        fn(x, p, seed="42")


def _probe() -> tuple[rnnc.Cell, rnnc.Value, rnnc.Value]:
    c = rnnc.Cell("probe")
    return c, c.input("x", 3), c.param("W", (3, 3))


@pytest.mark.parametrize("call,error,match", [
    (lambda x, W: rnnc.bernoulli(1.5, like=x), rnnc.RnncValueError, r"p is the probability"),
    (lambda x, W: rnnc.bernoulli(-0.1, like=x), rnnc.RnncValueError, r"in \[0, 1\]"),
    (lambda x, W: rnnc.bernoulli(float("nan"), like=x), rnnc.RnncValueError, r"in \[0, 1\]"),
    (lambda x, W: rnnc.bernoulli("0.5", like=x), rnnc.RnncTypeError, r"p must be a Python"),
    (lambda x, W: rnnc.bernoulli(True, like=x), rnnc.RnncTypeError, r"p must be a Python"),
    (lambda x, W: rnnc.bernoulli(0.5, like=x, per="batch"), rnnc.RnncValueError,
     r"per must be 'step'.*or 'sequence'"),
    (lambda x, W: rnnc.bernoulli(0.5, like=np.zeros((2, 3))), rnnc.RnncTypeError,
     r"like= must be a traced rnnc value"),
    (lambda x, W: rnnc.bernoulli(0.5, like=W), rnnc.ShapeError, r"per-step value \[B,n\]"),
])
def test_bad_bernoulli_calls_say_what_was_expected(call, error, match) -> None:
    _, x, W = _probe()
    with pytest.raises(error, match=match) as info:
        call(x, W)
    assert __file__ in str(info.value)  # names the user's line


def test_bernoulli_records_its_op_with_a_stream_per_call() -> None:
    c, x, _ = _probe()
    first, second = rnnc.bernoulli(0.5, like=x), rnnc.bernoulli(0.5, like=x, per="sequence")
    nodes = [c.graph.node(v.node) for v in (first, second)]
    assert [n.op for n in nodes] == [ops.bernoulli] * 2
    assert [n.attrs["stream"] for n in nodes] == [0, 1]
    assert nodes[1].attrs == {"p": 0.5, "per": "sequence", "size": 3, "stream": 1}
    assert first.shape == ("B", 3)


# ---------------------------------------------------------------- passes and gradients


def test_program_declares_the_random_args() -> None:
    program = cell_of_masks().program()
    assert program.args["rng.key"][0] == "random" and program.args["rng.key"][1].shape == (4,)
    assert program.args["rng.counter"][1].shape == ("T", "B", 4)
    assert "rng.counter" in program.scan.seqs and "rng.key" in program.scan.consts
    assert "random: rng.key: f32[4], rng.counter: f32[T,B,4]" in rnnc.printer.format_program(
        program)
    assert "rng.key" not in rnnc.cells.lstm(2, 3).program().args


def dropout_cell() -> rnnc.Cell:
    """Per-step and per-sequence masks on the input projection, the state and the output."""
    c = rnnc.Cell("dropped")
    x = c.input("x", 3)
    h = c.state("h", 4)
    W, U = c.param("W", (3, 4)), c.param("U", (4, 4))
    b = c.param("b", (4,))
    keep_x = rnnc.bernoulli(0.7, like=x, per="sequence") * (1 / 0.7)
    zone = rnnc.bernoulli(0.25, like=h)
    new = rnnc.tanh((x * keep_x) @ W + (h * (1 - zone)) @ U + b)
    c.update(h=rnnc.where(zone, h, new))
    c.output("y", new * rnnc.bernoulli(0.8, like=h))
    return c


def _masks(graph) -> int:
    """The bernoulli nodes of ``graph``, those inside its fused regions included."""
    return sum(_masks(node.attrs["region"]) if node.op is FUSED else node.op is ops.bernoulli
               for node in graph.nodes())


@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
def test_masks_stay_in_the_loop(mode: str) -> None:
    program = rnnc.compile(dropout_cell(), backend="numpy").program(mode)
    assert _masks(program.pre) == _masks(program.post) == 0
    assert _masks(program.scan.body) >= 3


def test_the_save_plan_holds_no_mask() -> None:
    """Backward draws the masks again: no saved value is a mask, nor computed from masks,
    parameters and constants alone (``1 - zone`` is drawn again too)."""
    cell = dropout_cell()
    program = passes.run(cell.program(), ["canonicalize", "fuse-gate-matmuls",
                                          "autodiff-forward"])
    body = program.scan.body
    (plan,) = program.saves
    assert plan, "the cell saves something (tanh's output)"
    for name, _ in plan:
        node = body.node(body.outputs[name])
        assert node.op is not ops.bernoulli, name
        assert not (node.op is ops.sub and any(body.node(i).op is ops.bernoulli
                                               for i in node.inputs)), name
    backward = passes.run(cell.program(), ["canonicalize", "fuse-gate-matmuls",
                                           "autodiff-backward"])
    assert any(n.op is ops.bernoulli for n in backward.scan.body.nodes())
    assert backward.args["rng.counter"][0] == "random"


@pytest.mark.parametrize("backend,options", BACKENDS, ids=IDS)
def test_backward_matches_central_differences_with_the_seed_fixed(backend, options) -> None:
    T, B, seed = 4, 2, 31
    cell = dropout_cell()
    fn = rnnc.compile(cell, backend=backend, **options)
    oracle = rnnc.compile(cell, backend="numpy", optimize=False)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, B, 3))
    p = cell.init_params(seed=1, dtype=np.float64)
    h0 = rng.uniform(-0.5, 0.5, (B, 4))
    wy, wh = rng.standard_normal((T, B, 4)), rng.standard_normal((B, 4))

    def loss() -> float:
        ys, st = oracle(x, p, {"h": h0}, seed=seed)
        return float((ys["y"] * wy).sum() + (st["h"] * wh).sum())

    _, _, tape = fn.forward(x, p, {"h": h0}, seed=seed)
    g = fn.backward(tape, {"y": wy}, {"h": wh})
    np.testing.assert_allclose(g.x, central_difference(loss, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.states["h"], central_difference(loss, h0), rtol=1e-6,
                               atol=1e-8)
    for k in p:
        np.testing.assert_allclose(g.params[k], central_difference(loss, p[k]), rtol=1e-6,
                                   atol=1e-8, err_msg=k)


@pytest.mark.skipif(available_compiler() is None, reason="no CUDA compiler (nvcc or NVRTC)")
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_mask_kernels_compile_to_ptx(dtype: str) -> None:
    """The kernels the emulator runs, with __umulhi from CUDA itself, compile for the GPU."""
    fn = rnnc.compile(dropout_cell(), backend="numpy")
    for mode in ("inference", "backward"):
        module = codegen.render(fn.program(mode, dtype))
        assert "__umulhi" in module.source and "rnnc_bernoulli(" in module.kernel_text
        ptx = compile_ptx(module.source, "sm_80")
        assert all(f".entry {name}(" in ptx for name in module.kernels)


@pytest.mark.skipif("llvm" not in IDS, reason="needs llvmlite")
def test_a_thread_team_splitting_the_batch_draws_the_same_masks() -> None:
    """Each thread of an LLVM team computes a block of batch rows; a row reads its own index
    from rng.counter, so the masks do not depend on the split."""
    from rnnc.backends.schedule import LlvmSchedule

    cell = rnnc.cells.zoneout_lstm(5, 16, 0.4, 0.4)
    team = rnnc.compile(cell, backend="llvm", threads=2, team=True, cache_dir=False,
                        schedule=LlvmSchedule(team_min_work=0))
    oracle = rnnc.compile(cell, optimize=False)
    rng = np.random.default_rng(6)
    x, p = rng.standard_normal((4, 7, 5)), cell.init_params(dtype=np.float64)
    dy = {"y": rng.standard_normal((4, 7, 16))}
    got, want = (f.forward(x, p, seed=11) for f in (team, oracle))
    np.testing.assert_allclose(got[0]["y"], want[0]["y"], rtol=1e-10, atol=1e-12)
    g, w = team.backward(got[2], dy), oracle.backward(want[2], dy)
    np.testing.assert_allclose(g.x, w.x, rtol=1e-9, atol=1e-11)


def test_double_backward_matches_central_differences_of_backward() -> None:
    """Second order: the backward program's own backward draws the masks once more."""
    cell, seed = dropout_cell(), 3
    rng = np.random.default_rng(7)
    x, p = rng.standard_normal((3, 2, 3)), cell.init_params(dtype=np.float64)
    h0 = rng.standard_normal((2, 4))
    dy, dh = {"y": rng.standard_normal((3, 2, 4))}, {"h": rng.standard_normal((2, 4))}
    gx, gh = rng.standard_normal(x.shape), rng.standard_normal(h0.shape)
    gp = {k: rng.standard_normal(v.shape) for k, v in p.items()}
    oracle = rnnc.compile(cell, optimize=False)

    def backward_dot() -> float:
        g = oracle.backward(oracle.forward(x, p, {"h": h0}, seed=seed)[2], dy, dh)
        return float((g.x * gx).sum() + (g.states["h"] * gh).sum()
                     + sum((g.params[k] * gp[k]).sum() for k in p))

    fn = rnnc.compile(cell, backend="numpy")
    tape = fn.forward(x, p, {"h": h0}, seed=seed)[2]
    _, _, grads = fn.double_backward(tape, dy, dh, {"x": gx}, gp, {"h": gh})
    for k in ("W", "U"):
        np.testing.assert_allclose(grads.params[k], central_difference(backward_dot, p[k]),
                                   rtol=1e-6, atol=1e-8, err_msg=k)
    np.testing.assert_allclose(grads.states["h"], central_difference(backward_dot, h0),
                               rtol=1e-6, atol=1e-8)


def test_check_runs_cells_that_draw_masks() -> None:
    rnnc.compile(dropout_cell(), check=True, backend="numpy")


# ---------------------------------------------------------------- layers and torch


def _dropped(input_size: int, hidden_size: int) -> rnnc.Cell:
    return rnnc.cells.zoneout_lstm(input_size, hidden_size, 0.3, 0.3)


def test_layers_take_a_seed_and_derive_one_per_layer_and_direction() -> None:
    layer = rnnc.RNN(_dropped, 3, 4, num_layers=2, bidirectional=True, seed=0,
                     dtype=np.float64, backend="numpy")
    assert layer.draws_masks
    x = np.random.default_rng(5).standard_normal((5, 2, 3))
    a, _ = layer(x, seed=7)
    b, _ = layer(x, seed=7)
    c, _ = layer(x, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    seeds = {rnnc.layers.run.layer_seed(7, k, d) for k in range(2) for d in range(2)}
    assert len(seeds) == 4 and 7 not in seeds
    d1, _ = layer(x)  # no seed: one from the layer's random stream
    d2, _ = layer(x)
    assert not np.allclose(d1, d2)
    y, _, tape = layer.forward(x, seed=7)
    np.testing.assert_array_equal(y, a)
    g = layer.backward(tape, np.ones_like(y))
    assert np.isfinite(g.x).all()
    with pytest.raises(rnnc.RnncValueError, match="seed must be"):
        layer(x, seed=-3)


def test_torch_module_draws_its_seed_from_torch() -> None:
    torch = pytest.importorskip("torch")
    from rnnc.torch import RNN

    module = RNN(_dropped, 3, 4, backend="numpy", dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    a, _ = module(x)
    torch.manual_seed(0)
    b, _ = module(x)
    c, _ = module(x)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    a.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
