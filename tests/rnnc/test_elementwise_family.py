"""The elementwise family, op by op from its table: shape rule, reference against torch, VJP
against float64 central differences, and the DSL surface (functions, ``%``, ``//``, errors).

Every member of the family's table with operand draws (``rnnc.ops_elementwise.DRAWN``) is
tested here without a row of its own: a new op is tested by declaring it with its draws. The one
thing a member needs here is its torch oracle in ``TORCH`` (``test_every_member_has_an_oracle``
fails without it). Backends:
``tests/backends/test_elementwise_family_backends.py``.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import rnnc
from rnnc import ops
from rnnc import ops_elementwise as elementwise
from rnnc.errors import RnncError, ShapeError

torch = pytest.importorskip("torch")

FAMILY = [pytest.param(m, id=m.op.name) for m in elementwise.DRAWN]
EPS = 1e-6

# The independent oracle of each member's reference: torch's own function, in float64.
TORCH = {
    "less": lambda a, b: torch.lt(a, b).double(),
    "less_equal": lambda a, b: torch.le(a, b).double(),
    "greater": lambda a, b: torch.gt(a, b).double(),
    "greater_equal": lambda a, b: torch.ge(a, b).double(),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "abs": torch.abs,
    "floor": torch.floor,
    "round": torch.round,
    "mod": torch.remainder,
    "floor_divide": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "clip": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "sin": torch.sin,
    "cos": torch.cos,
    "log_sigmoid": torch.nn.functional.logsigmoid,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "erf": torch.erf,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
}


def _operands(member: elementwise.Member, shape=(3, 4)) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(member.op.name.encode()))
    return [np.asarray(draw(rng, shape), np.float64) for draw in member.draws]


def test_every_member_has_an_oracle() -> None:
    assert sorted(TORCH) == sorted(m.op.name for m in elementwise.DRAWN)


def test_members_are_registered_elementwise_primitives() -> None:
    for member in elementwise.FAMILY:
        assert ops.REGISTRY[member.op.name] is member.op in ops.ELEMENTWISE
        assert member.op.arity == len(member.draws) or not member.draws


@pytest.mark.parametrize("member", FAMILY)
def test_shape_rule_broadcasts_and_refuses(member: elementwise.Member) -> None:
    attrs = member.test_attrs
    shape = member.op.shape
    if member.op.arity == 1:
        for s in (("B", 4), ("T", "B", 4), (4,), ()):
            assert shape(s, **attrs) == s
    else:
        assert shape(("B", 4), (4,), **attrs) == ("B", 4)
        assert shape(("B", 1), ("T", "B", 4), **attrs) == ("T", "B", 4)
        with pytest.raises(ShapeError, match="cannot broadcast"):
            shape(("B", 4), ("B", 5), **attrs)


@pytest.mark.parametrize("member", FAMILY)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reference_matches_torch_and_keeps_dtype(member: elementwise.Member, dtype) -> None:
    xs = [x.astype(dtype) for x in _operands(member, (64,))]
    got = member.op.ref(*xs, **member.test_attrs)
    assert got.dtype == dtype and got.shape == xs[0].shape
    want = TORCH[member.op.name](*(torch.from_numpy(x.astype(np.float64)) for x in xs),
                                 **member.test_attrs).numpy()
    tol = 1e-15 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("member", FAMILY)
def test_vjp_matches_central_differences(member: elementwise.Member) -> None:
    """A None cotangent claims a zero derivative: the differences must be zero too."""
    from test_vjp import EagerEmitter

    xs = _operands(member)
    attrs = member.test_attrs
    y = member.op.ref(*xs, **attrs)
    g = np.random.default_rng(1).standard_normal(y.shape)
    grads = member.op.vjp(EagerEmitter(), g, xs, y, **attrs)
    assert len(grads) == len(xs)
    for k, x in enumerate(xs):
        plus, minus = list(xs), list(xs)
        plus[k], minus[k] = x + EPS, x - EPS
        # Elementwise: one perturbation of every element at once gives each element's slope.
        want = g * (member.op.ref(*plus, **attrs) - member.op.ref(*minus, **attrs)) / (2 * EPS)
        got = np.zeros_like(want) if grads[k] is None else grads[k]
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7,
                                   err_msg=f"{member.op.name} operand {k}")


def test_vjp_rules_emit_only_registered_primitives() -> None:
    from test_vjp import EagerEmitter

    class Recorder(EagerEmitter):
        def __call__(self, op, *xs, **attrs):
            assert ops.REGISTRY.get(op.name) is op, op
            return super().__call__(op, *xs, **attrs)

    for member in elementwise.DRAWN:
        xs = _operands(member)
        y = member.op.ref(*xs, **member.test_attrs)
        member.op.vjp(Recorder(), np.ones_like(y), xs, y, **member.test_attrs)


def test_round_takes_halves_to_even_and_mod_has_the_divisors_sign() -> None:
    halves = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(elementwise.round_.ref(halves), [-2, -2, -0, 0, 2, 2, 4])
    a = np.array([-7.0, 7.0, -7.0, 7.0, 6.0, -6.0])
    b = np.array([3.0, -3.0, -3.0, 3.0, -3.0, 3.0])
    got = elementwise.mod.ref(a, b)
    np.testing.assert_array_equal(got, [2.0, -2.0, -1.0, 1.0, -0.0, 0.0])
    assert list(np.signbit(got)) == [False, True, True, False, True, False]


def test_log_sigmoid_is_finite_and_exact_at_large_magnitudes() -> None:
    x = np.array([-1e4, -100.0, 100.0, 1e4])
    np.testing.assert_allclose(elementwise.log_sigmoid.ref(x), [-1e4, -100.0, -np.exp(-100.0), 0.0],
                               rtol=1e-15, atol=0)
    got = elementwise.log_sigmoid.ref(x.astype(np.float32))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [-1e4, -100.0, -np.exp(-100.0), 0.0], rtol=1e-7, atol=1e-44)


def _one_input_cell(build) -> rnnc.Cell:
    cell = rnnc.Cell("dsl")
    x = cell.input("x", 4)
    h = cell.state("h", 4)
    cell.update(h=h)
    cell.output("y", build(x))
    return cell


def _graph_ops(cell: rnnc.Cell) -> list[str]:
    return [n.op.name for n in cell.graph.nodes()]


def test_percent_and_floor_division_build_mod_and_floor_divide() -> None:
    xs = np.random.default_rng(2).uniform(-5, 5, (2, 3, 4))
    for build, want in [(lambda x: x % 1.5, np.mod(xs, 1.5)),
                        (lambda x: 2.0 % (x * x + 0.5), np.mod(2.0, xs * xs + 0.5)),
                        (lambda x: x // 0.75, np.floor_divide(xs, 0.75)),
                        (lambda x: 7.0 // (x * x + 0.5), np.floor_divide(7.0, xs * xs + 0.5))]:
        cell = _one_input_cell(build)
        assert {"mod", "floor_divide"} & set(_graph_ops(cell))
        ys, _ = rnnc.compile(cell, backend="numpy")(xs, {})
        np.testing.assert_array_equal(ys["y"], want)


@pytest.mark.parametrize("lo,hi,message", [
    (1.0, -1.0, "lo <= hi"), (float("nan"), 1.0, "NaN"), ("0", 1.0, "constant Python number"),
    (0.0, True, "constant Python number")])
def test_clip_refuses_bad_bounds(lo, hi, message) -> None:
    cell = rnnc.Cell("bad_clip")
    x = cell.input("x", 4)
    with pytest.raises(ShapeError, match=message) as info:
        rnnc.clip(x, lo, hi)
    assert isinstance(info.value, RnncError)


@pytest.mark.parametrize("backend", [{"backend": "numpy"}, {"backend": "llvm"},
                                     {"backend": "cuda", "emulate": True}],
                         ids=["numpy", "llvm", "cuda"])
def test_clip_gradient_matches_torch_clamp_at_and_beyond_the_bounds(backend: dict) -> None:
    """Through each backend's backward program: 1 on [lo, hi] bounds included, 0 outside, as
    torch.clamp (central differences cannot see the bounds themselves)."""
    xs = np.array([[[-2.0, -1.0, 0.25, 0.5], [0.75, 1.0, 3.0, -1.0]]])
    cell = _one_input_cell(lambda x: rnnc.clip(x, -1.0, 1.0))
    fn = rnnc.compile(cell, **backend)
    _, _, tape = fn.forward(xs, {})
    dy = np.arange(1.0, 9.0).reshape(xs.shape)
    got = fn.backward(tape, d_outputs={"y": dy}).x
    x = torch.tensor(xs, requires_grad=True)
    (torch.clamp(x, -1.0, 1.0) * torch.from_numpy(dy)).sum().backward()
    np.testing.assert_array_equal(got, x.grad.numpy())


def test_family_functions_are_public_and_documented() -> None:
    for member in elementwise.FAMILY:
        assert member.op.doc, member.op.name
        if member.op.dsl_function:
            function = getattr(rnnc, member.op.name)
            assert member.op.name in rnnc.__all__
            assert function.__doc__ == member.op.doc
