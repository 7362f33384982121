"""rnnc.torch.RNN as a drop-in for torch.nn.LSTM / GRU / RNN.

The behaviours of torch's own recurrent-module tests, restated: each test runs against
``torch.nn`` (showing that the test states what torch does) and against ``rnnc.torch.RNN``.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import rnnc
import rnnc.torch as rt
from rnnc.cells import mgu

F64 = torch.float64
IMPLS = ("torch", "rnnc")


def make(impl: str, kind: str, *args, **kwargs) -> nn.Module:
    """``nn.LSTM(...)`` or the same module computed by rnnc (kind: LSTM, GRU or RNN)."""
    if impl == "torch":
        return getattr(nn, kind)(*args, **kwargs)
    return rt.RNN(kind, *args, **kwargs)


def raises(impl: str, torch_kind: type[Exception]):
    """Expect torch's exception kind; from rnnc it must also be an ``RnncError``."""
    return pytest.raises(torch_kind if impl == "torch" else (torch_kind, rnnc.RnncError))


def check_rnnc_error(impl: str, info: pytest.ExceptionInfo) -> None:
    if impl == "rnnc":
        assert isinstance(info.value, rnnc.RnncError), info.value


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arg", ["bias", "batch_first"])
def test_bool_arguments_must_be_bool(impl, arg):
    with pytest.raises(TypeError, match=arg) as info:
        make(impl, "LSTM", 3, 4, **{arg: "False"})
    check_rnnc_error(impl, info)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kwargs, kind", [
    ({"dropout": 1.1}, ValueError), ({"dropout": -0.1}, ValueError),
    ({"dropout": True}, ValueError), ({"hidden_size": 0}, ValueError),
    ({"hidden_size": 4.0}, TypeError), ({"input_size": 0}, ValueError),
    ({"num_layers": 0}, ValueError), ({"proj_size": -1}, ValueError),
    ({"proj_size": 4}, ValueError),
])
def test_bad_constructor_arguments(impl, kwargs, kind):
    args = {"input_size": 3, "hidden_size": 4, **kwargs}
    with pytest.raises(kind) as info:
        make(impl, "LSTM", **args)
    check_rnnc_error(impl, info)


@pytest.mark.parametrize("impl", IMPLS)
def test_accepted_arguments_and_attributes(impl):
    assert make(impl, "LSTM", 3, 4, num_layers=2, dropout=1.0).dropout == 1.0
    plain = make(impl, "LSTM", 3, 4, proj_size=0)
    assert plain.proj_size == 0 and plain.weight_hh_l0.shape == (16, 4)
    rnn = make(impl, "RNN", 3, 4, nonlinearity="relu", num_layers=2, bidirectional=True)
    assert rnn.nonlinearity == "relu"
    assert [[tuple(w.shape) for w in ws] for ws in rnn.all_weights] == [
        [(4, 3), (4, 4), (4,), (4,)]] * 2 + [[(4, 8), (4, 4), (4,), (4,)]] * 2
    assert rnn.all_weights[3][0] is rnn.weight_ih_l1_reverse
    with raises(impl, ValueError):
        make(impl, "RNN", 3, 4, nonlinearity="sigmoid")


@pytest.mark.parametrize("impl", IMPLS + ("layer",))
def test_dropout_with_one_layer_warns_in_torch_words(impl):
    # Dropout applies between layers only; rnnc.RNN (the "layer") said nothing.
    words = ("dropout option adds dropout after all but last recurrent layer, so non-zero "
             "dropout expects num_layers greater than 1, but got dropout=0.5 and num_layers=1")
    with pytest.warns(UserWarning) as caught:
        if impl == "layer":
            rnnc.RNN("lstm", 3, 4, dropout=0.5)
        else:
            make(impl, "LSTM", 3, 4, dropout=0.5)
    assert [str(w.message) for w in caught] == [words]  # once, not also from the inner layer
    # rnnc's points at the caller's line (torch's at its own LSTM.__init__).
    assert impl == "torch" or caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(impl, "LSTM", 3, 4, num_layers=2, dropout=0.5) if impl != "layer" else \
            rnnc.RNN("lstm", 3, 4, num_layers=2, dropout=0.5)


@pytest.mark.parametrize("impl", IMPLS)
def test_changing_dropout_after_construction_takes_effect(impl):
    torch.manual_seed(0)
    m = make(impl, "GRU", 3, 4, num_layers=2).train()
    a, b = torch.randn(5, 2, 3), torch.randn(5, 2, 3)
    assert not torch.allclose(m(a)[0], m(b)[0])
    m.dropout = 1.0  # everything between the layers is dropped: the input no longer matters
    torch.testing.assert_close(m(a)[0], m(b)[0])
    m.eval()
    assert not torch.allclose(m(a)[0], m(b)[0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch_first", [False, True])
def test_empty_batch_gives_empty_output_and_backward_works(impl, batch_first):
    m = make(impl, "LSTM", 3, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = torch.randn((0, 5, 3) if batch_first else (5, 0, 3), requires_grad=True)
    y, (h, c) = m(x)
    assert y.shape == ((0, 5, 8) if batch_first else (5, 0, 8))
    assert h.shape == c.shape == (4, 0, 4)
    (y.sum() + h.sum() + c.sum()).backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None and not p.grad.any() for p in m.parameters())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape, batch_first", [((0, 2, 3), False), ((2, 0, 3), True),
                                                ((0, 3), False)])
def test_zero_length_sequence_raises(impl, shape, batch_first):
    m = make(impl, "GRU", 3, 4, batch_first=batch_first)
    with raises(impl, RuntimeError) as info:
        m(torch.randn(shape))
    check_rnnc_error(impl, info)


def _bad_calls():
    x = torch.randn(5, 3, 3)
    h, c = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    return {
        "features": (RuntimeError, (torch.randn(5, 3, 2),)),
        "4-D input": (ValueError, (torch.randn(5, 3, 3, 1),)),
        "1-D input": (ValueError, (torch.randn(5),)),
        "dtype": (ValueError, (x.double(),)),
        "h batch": (RuntimeError, (x, (torch.randn(1, 2, 4), c))),
        "c size": (RuntimeError, (x, (h, torch.randn(1, 3, 5)))),
        "2-D state, 3-D input": (RuntimeError, (x, (h[0], c[0]))),
        "3-D state, 2-D input": (RuntimeError, (x[:, 0], (h, c))),
    }


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_inputs_raise_torchs_error_kind(impl, case):
    kind, args = _bad_calls()[case]
    m = make(impl, "LSTM", 3, 4)
    with pytest.raises(kind) as info:
        m(*args)
    check_rnnc_error(impl, info)


def _round_trips():
    def through_torch_save(m):
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    return {"pickle": lambda m: pickle.loads(pickle.dumps(m)), "deepcopy": copy.deepcopy,
            "torch.save": through_torch_save}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", list(_round_trips()))
def test_copies_compute_the_same_and_train_apart(impl, how):
    torch.manual_seed(0)
    m = make(impl, "LSTM", 3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3)
    y, _ = m(x)
    clone = _round_trips()[how](m)
    torch.testing.assert_close(clone(x)[0], y, rtol=0, atol=0)
    clone(x)[0].sum().backward()  # the copy trains, and its parameters are its own
    with torch.no_grad():
        clone.weight_ih_l0.add_(1.0)
    torch.testing.assert_close(m(x)[0], y, rtol=0, atol=0)


def test_custom_cell_pickles_when_its_factory_is_importable():
    m = rt.RNN(mgu, 3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    torch.testing.assert_close(pickle.loads(pickle.dumps(m))(x)[0], m(x)[0], rtol=0, atol=0)


def test_lambda_factory_deepcopies_but_does_not_pickle():
    m = rt.RNN(lambda i, h: mgu(i, h), 3, 4)
    x = torch.randn(5, 2, 3)
    torch.testing.assert_close(copy.deepcopy(m)(x)[0], m(x)[0], rtol=0, atol=0)
    with pytest.raises(rnnc.RnncError, match="module-level function") as info:
        pickle.dumps(m)
    assert isinstance(info.value, pickle.PicklingError)


@pytest.mark.parametrize("impl", IMPLS)
def test_projection_parameters_and_state_sizes(impl):
    m = make(impl, "LSTM", 3, 5, num_layers=2, bidirectional=True, proj_size=2)
    names = [(n, tuple(p.shape)) for n, p in m.named_parameters()]
    layer0 = [("weight_ih_l0", (20, 3)), ("weight_hh_l0", (20, 2)), ("bias_ih_l0", (20,)),
              ("bias_hh_l0", (20,)), ("weight_hr_l0", (2, 5))]
    assert names[:5] == layer0 and names[10] == ("weight_ih_l1", (20, 4))
    y, (h, c) = m(torch.randn(6, 3, 3))
    assert (y.shape, h.shape, c.shape) == ((6, 3, 4), (4, 3, 2), (4, 3, 5))
    with raises(impl, RuntimeError):
        m(torch.randn(6, 3, 3), (torch.zeros(4, 3, 5), torch.zeros(4, 3, 5)))


@pytest.mark.parametrize("num_layers, bidirectional, batch_first", [
    (1, False, False), (2, True, False), (3, True, True)])
def test_projection_matches_torch(num_layers, bidirectional, batch_first):
    torch.manual_seed(1)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first,
              proj_size=3, dtype=F64)
    ref, ours = nn.LSTM(4, 6, **kw), rt.RNN("LSTM", 4, 6, **kw)
    ours.load_state_dict(ref.state_dict())
    D = 2 if bidirectional else 1
    x = torch.randn((2, 5, 4) if batch_first else (5, 2, 4), dtype=F64)
    hx = (torch.randn(num_layers * D, 2, 3, dtype=F64), torch.randn(num_layers * D, 2, 6,
                                                                     dtype=F64))
    results = []
    for m in (ref, ours):
        inputs = [t.clone().requires_grad_() for t in (x, *hx)]
        y, (h, c) = m(inputs[0], tuple(inputs[1:]))
        (y.pow(2).sum() + (h * 3).sum() + c.sin().sum()).backward()
        results.append([y, h, c, *(t.grad for t in inputs), *(p.grad for p in m.parameters())])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_gradcheck_with_batched_gradients(impl, kind):
    torch.manual_seed(0)
    m = make(impl, kind, 2, 3, num_layers=2, bidirectional=True, dtype=F64)
    names = [n for n, _ in m.named_parameters()]
    n_states = 2 if kind == "LSTM" else 1

    def f(x, *rest):
        hx = rest[:n_states]
        out, h = torch.func.functional_call(
            m, dict(zip(names, rest[n_states:], strict=True)),
            (x, hx if n_states == 2 else hx[0]))
        return (out, *h) if n_states == 2 else (out, h)

    inputs = [torch.randn(3, 2, 2, dtype=F64)] + [torch.randn(4, 2, 3, dtype=F64)] * n_states
    inputs += [p.detach() for p in m.parameters()]
    inputs = [t.clone().requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(f, inputs, check_batched_grad=True)


@pytest.mark.parametrize("batch_first", [False, True])
def test_vmap_over_inputs_and_over_parameters(batch_first):
    # rnnc only: torch 2.13 has no batching rule for aten::lstm; the oracle is one call a slice
    torch.manual_seed(0)
    m = rt.RNN("LSTM", 3, 4, num_layers=2, batch_first=batch_first, dtype=F64)
    xs = torch.randn((3, 2, 5, 3) if batch_first else (3, 5, 2, 3), dtype=F64)  # B = 2
    h0 = torch.randn(3, 2, 2, 4, dtype=F64)
    y, (h, c) = torch.func.vmap(lambda x, h: m(x, (h, torch.zeros_like(h))))(xs, h0)
    for i in range(3):
        yi, (hi, ci) = m(xs[i], (h0[i], torch.zeros_like(h0[i])))
        torch.testing.assert_close((y[i], h[i], c[i]), (yi, hi, ci))
    weights = torch.stack([m.weight_hh_l1.detach() * s for s in (0.5, 1.0, 2.0)])

    def run(w):
        return torch.func.functional_call(m, {"weight_hh_l1": w}, (xs[0],))[0]

    got = torch.func.vmap(run)(weights)
    for i in range(3):
        torch.testing.assert_close(got[i], run(weights[i]))


@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_over_vector_jacobian_products(impl):
    torch.manual_seed(0)
    m = make(impl, "GRU", 3, 4, dtype=F64)
    x = torch.randn(5, 2, 3, dtype=F64)
    y, vjp = torch.func.vjp(lambda x: m(x)[0], x)
    cotangents = torch.randn(3, *y.shape, dtype=F64)
    got = torch.func.vmap(vjp)(cotangents)[0]
    for i in range(3):
        torch.testing.assert_close(got[i], vjp(cotangents[i])[0])

# Double backward (gradgradcheck) and torch.compile: test_torch_higher_order.py.
