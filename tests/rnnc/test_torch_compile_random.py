"""rnnc.torch.RNN under torch.compile: in-cell masks and one compiled graph per configuration.

A cell that draws ``rnnc.bernoulli`` masks must get, compiled, the gradients of the masks its
forward drew, and torch's generator must decide them, as it decides ``nn.Dropout``'s, eager and
compiled alike. The oracle is the unoptimized traced program (``rnnc.compile(cell,
optimize=False)``) in float64, run with the seed ``torch.manual_seed`` dictates (see
tests/fuzz/torch_compile.py, whose ``oracle`` and ``run_module`` these tests use). Modules of one
configuration share the op's key, so ``torch.compile`` compiles one graph for all of them.
"""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import torch

import rnnc
import rnnc.torch as rt
from rnnc.cells_published import variational_lstm, zoneout_lstm
from rnnc.errors import RnncRuntimeError
from rnnc.interop import torch_ops
from tests.fuzz import torch_compile as fz

F64 = torch.float64


def zoneout(input_size: int, hidden_size: int):
    return zoneout_lstm(input_size, hidden_size, zoneout_c=0.5, zoneout_h=0.5)


def variational(input_size: int, hidden_size: int):
    return variational_lstm(input_size, hidden_size, dropout_x=0.5, dropout_h=0.5)


def _case(factory, T: int = 5, B: int = 2, bidirectional: bool = True):
    """A module of ``factory``'s cell (input 3, hidden 4) and float64 data for it."""
    module = rt.RNN(factory, 3, 4, backend="numpy", bidirectional=bidirectional, dtype=F64)
    rng = np.random.default_rng(0)
    D = 2 if bidirectional else 1

    def t(*shape):
        return torch.from_numpy(rng.standard_normal(shape))

    sizes = module.layer.state_sizes
    data = fz.Data(t(T, B, 3), {}, {n: t(D, B, s) * 0.5 for n, s in sizes.items()},
                   t(T, B, D * 4), {n: t(D, B, s) for n, s in sizes.items()},
                   {n: p.detach().clone() for n, p in module.named_parameters()})
    return module, data


def _oracle(factory, module, data, manual_seed: int):
    return fz.oracle(factory, module, data, fz.torch_seed(manual_seed))


def _assert_matches(got: dict, want: dict) -> None:
    assert set(want) <= set(got)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-10, atol=1e-10, err_msg=key)


@pytest.mark.parametrize("factory", [zoneout, variational])
def test_compiled_masks_get_their_own_gradients(factory):
    """Compiled with aot_eager: the loss and every gradient are those of the masks
    ``torch.manual_seed`` dictates (before the fix dL/dx was off by ~0.2: the backward op
    drew new masks from the layer's NumPy stream)."""
    module, data = _case(factory)
    want = _oracle(factory, module, data, manual_seed=11)
    torch._dynamo.reset()
    compiled = torch.compile(fz._eager, backend="aot_eager", fullgraph=True)
    for _ in range(2):  # the second call reuses the compiled graph
        _assert_matches(fz.run_module(compiled, module, data, 11), want)
    # eager draws the same seed from torch's generator: the same masks
    _assert_matches(fz.run_module(fz._eager, module, data, 11), want)
    other = fz.run_module(compiled, module, data, 12)
    assert np.abs(other["grad x"] - want["grad x"]).max() > 1e-3  # the masks matter


def test_eval_mode_draws_a_cells_masks_from_torch_too():
    """A cell's own masks are the cell's: eval() leaves them on, still governed by torch."""
    module, data = _case(zoneout, bidirectional=False)
    module.eval()
    want = _oracle(zoneout, module, data, manual_seed=3)
    torch._dynamo.reset()
    compiled = torch.compile(fz._eager, backend="aot_eager", fullgraph=True)
    _assert_matches(fz.run_module(compiled, module, data, 3), want)


def test_compiled_dropout_between_layers_follows_torch_manual_seed():
    """Dropout between layers, compiled, is eager's: same torch seed, same masks."""
    torch.manual_seed(0)
    module = rt.RNN("GRU", 3, 4, num_layers=2, dropout=0.5, backend="numpy", dtype=F64)
    x = torch.randn(5, 2, 3, dtype=F64)

    def run(call, manual_seed):
        leaf = x.clone().requires_grad_()
        torch.manual_seed(manual_seed)
        y, _ = call(leaf)
        y.pow(2).sum().backward()
        return y.detach(), leaf.grad

    torch._dynamo.reset()
    compiled = torch.compile(lambda v: module(v), backend="aot_eager", fullgraph=True)
    want = run(module, 5)
    torch.testing.assert_close(run(compiled, 5), want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(run(compiled, 6)[0], want[0])


@pytest.mark.slow
def test_inductor_backward_draws_the_forward_masks(monkeypatch):
    """With inductor the seed comes from inductor's own generator (still torch.manual_seed's),
    so the oracle takes the seed the op saw: forward and backward op saw the same one."""
    seen: list[int] = []
    original = torch_ops._run

    def spy(key, x, states, params, lengths, seed, *rest, **kwargs):
        seen.append(int(seed.item()))
        return original(key, x, states, params, lengths, seed, *rest, **kwargs)

    monkeypatch.setattr(torch_ops, "_run", spy)
    module, data = _case(zoneout, bidirectional=False)
    torch._dynamo.reset()
    compiled = torch.compile(fz._eager, backend="inductor", fullgraph=True)
    got = fz.run_module(compiled, module, data, 11)
    assert len(seen) == 2 and seen[0] == seen[1]  # the forward op, then the backward op
    monkeypatch.setattr(fz, "torch_seed", lambda manual_seed: seen[0])
    _assert_matches(got, _oracle(zoneout, module, data, 11))


# -- one compiled graph per configuration


def test_modules_of_one_configuration_share_one_compiled_graph():
    """Ten GRUs of one configuration through one fullgraph function: one graph, no
    recompile (before the fix each module had its own key: the ninth raised
    FailOnRecompileLimitHit), and each module's result is its own."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch.manual_seed(0)
    modules = [rt.RNN("GRU", 3, 4, backend="numpy", dtype=F64) for _ in range(10)]
    x = torch.randn(5, 2, 3, dtype=F64)
    torch._dynamo.reset()

    @torch.compile(backend=backend, fullgraph=True)
    def loss(module, v):
        return module(v)[0].pow(2).sum()

    def value_and_grad(impl):
        leaf = x.clone().requires_grad_()
        value = impl(leaf)
        value.backward()
        return value.detach(), leaf.grad

    for module in modules:
        twin = torch.nn.GRU(3, 4, dtype=F64)  # the oracle: torch's own GRU, same weights
        twin.load_state_dict(module.state_dict())
        torch.testing.assert_close(value_and_grad(lambda v: loss(module, v)),  # noqa: B023
                                   value_and_grad(lambda v: twin(v)[0].pow(2).sum()))  # noqa: B023
    assert len(graphs) == 1
    assert len({m._op_key for m in modules}) == 1


def test_the_key_follows_what_changes_the_code():
    """Equal cells share a key whatever factory made them; a different size, backend, dropout
    or direction does not; changing dropout moves a module to the other key."""
    def key(*args, **kwargs):
        return rt.RNN(*args, **kwargs)._op_key

    base = key(zoneout, 3, 4, backend="numpy")
    assert key(lambda i, h: zoneout_lstm(i, h, 0.5, 0.5), 3, 4, backend="numpy") == base
    different = [key(zoneout, 3, 5, backend="numpy"), key(zoneout, 2, 4, backend="numpy"),
                 key(variational, 3, 4, backend="numpy"),
                 key(zoneout, 3, 4, backend="numpy", bidirectional=True),
                 key(zoneout, 3, 4, backend="numpy", batch_first=True),
                 key("LSTM", 3, 4, backend="numpy"), key("GRU", 3, 4, backend="numpy")]
    assert base not in different and len(set(different)) == len(different)
    m = rt.RNN("GRU", 3, 4, num_layers=2, backend="numpy")
    before = m._op_key
    m.dropout = 0.25
    assert m._op_key != before == key("GRU", 3, 4, num_layers=2, backend="numpy")
    assert m._op_key == key("GRU", 3, 4, num_layers=2, dropout=0.25, backend="numpy")


def test_a_key_outlives_the_module_that_made_it():
    """The op runs on any live module of its configuration, with the call's own weights."""
    first = rt.RNN("GRU", 3, 4, backend="numpy", dtype=F64)
    key = first._op_key
    second = rt.RNN("GRU", 3, 4, backend="numpy", dtype=F64)
    del first
    gc.collect()
    assert torch_ops.module_of(key) is second
    x = torch.randn(4, 1, 3, dtype=F64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v: second(v)[0], backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), second(x)[0])


def test_a_key_without_a_live_module_raises():
    with pytest.raises(RnncRuntimeError, match="no rnnc.torch.RNN of that configuration"):
        torch_ops.module_of(10**9)


def parameterless(input_size: int, hidden_size: int):
    """h' = tanh(x + h), y = h * x: a cell without parameters."""
    c = rnnc.Cell("parameterless")
    x, h = c.input("x", input_size), c.state("h", input_size)
    c.update(h=rnnc.tanh(x + h))
    c.output("y", h * x)
    return c


def test_a_cell_without_parameters_runs_eager_and_compiled():
    """The module has no weights to take a dtype from: it computes in its own (this raised
    IndexError from the input check). The oracle is the same loop in torch."""
    module = rt.RNN(parameterless, 3, 3, backend="numpy", dtype=F64)
    x = torch.randn(4, 2, 3, dtype=F64)
    h0 = torch.randn(1, 2, 3, dtype=F64)

    def loop(v, h):
        ys, h = [], h[0]
        for t in range(v.shape[0]):
            ys.append(h * v[t])
            h = torch.tanh(v[t] + h)
        return torch.stack(ys), h[None]

    def value_and_grads(call):
        leaves = [t.clone().requires_grad_() for t in (x, h0)]
        y, h = call(*leaves)
        loss = y.pow(2).sum() + h.sum()
        return (loss.detach(), *torch.autograd.grad(loss, leaves))

    want = value_and_grads(loop)
    torch.testing.assert_close(value_and_grads(lambda v, h: _as_pair(module(v, {"h": h}))),
                               want)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v, h: _as_pair(module(v, {"h": h})), backend="aot_eager",
                             fullgraph=True)
    torch.testing.assert_close(value_and_grads(compiled), want)


def _as_pair(result):
    y, states = result
    return y, states["h"]


def test_a_module_pickled_without_draws_masks_loads_with_it():
    """Modules saved before they kept ``draws_masks`` learn it from their layer on loading."""
    module = rt.RNN(zoneout, 3, 4, backend="numpy")
    del module.__dict__["draws_masks"]
    loaded = pickle.loads(pickle.dumps(module))
    assert loaded.draws_masks is True
    assert loaded._op_key == rt.RNN(zoneout, 3, 4, backend="numpy")._op_key
