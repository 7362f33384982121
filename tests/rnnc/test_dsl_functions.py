"""The DSL functions come from the op registry: one per op a cell calls by name.

Each public function exists under the op's name in ``rnnc`` and ``rnnc.dsl``, is listed in
``rnnc.__all__``, has a docstring, and records exactly the op it is named after.
"""

from __future__ import annotations

import inspect

import pytest

import rnnc
from rnnc import dsl, ops
from rnnc import ops_elementwise as elementwise

# The DSL functions rnnc has always had: generating them must keep every one.
PUBLIC = sorted(["concat", "exp", "log", "mean", "relu", "rsqrt", "sigmoid", "sqrt", "sum", "tanh",
                 "where", "abs", "amax", "amin", "greater", "greater_equal", "less", "less_equal",
                 "maximum", "minimum", "softplus", "stop_gradient", "bernoulli",
                 # the elementwise family's additions
                 "floor", "round", "mod", "floor_divide", "clip", "sin", "cos", "log_sigmoid",
                 "silu", "gelu", "erf", "log1p", "expm1",
                 # values with feature shapes (rnnc.dsl_tensor: a spec, a shape)
                 "einsum", "reshape"])
OWN_SIGNATURES = {"einsum", "reshape"}


def test_the_public_functions_are_the_registry_minus_operators() -> None:
    assert sorted(dsl.FUNCTIONS) == PUBLIC
    for name in ops.REGISTRY:
        assert (name in dsl.FUNCTIONS) == (ops.REGISTRY[name].dsl_function
                                           or name in OWN_SIGNATURES), name


def _operands(cell: rnnc.Cell, function) -> list:
    x = cell.input("x", 3)
    h = cell.state("h", 3)
    cell.update(h=h)
    if function is dsl.FUNCTIONS["concat"]:
        return [[x, h]]
    if function is dsl.FUNCTIONS["bernoulli"]:  # a probability and a value to take the shape of
        return [0.5, x]
    if function is dsl.FUNCTIONS["einsum"]:  # a spec, then the operands
        return ["i,i->i", x, h]
    if function is dsl.FUNCTIONS["reshape"]:  # a value, then its new feature shape
        return [x, (3, 1)]
    member = elementwise.MEMBERS.get(function.__name__)
    if member is not None and member.attributes:  # operands, then the constant attributes
        return [x, h, x][:member.op.arity] + [member.test_attrs[a] for a in member.attributes]
    return [x, h, x][:len(inspect.signature(function).parameters)]


@pytest.mark.parametrize("name", PUBLIC)
def test_function_exists_is_documented_and_builds_its_op(name: str) -> None:
    function = getattr(rnnc, name)
    assert function is getattr(dsl, name) is dsl.FUNCTIONS[name]
    assert name in rnnc.__all__ and name in dsl.__all__
    assert function.__name__ == name
    assert function.__doc__ and function.__doc__.strip()
    cell = rnnc.Cell("probe")
    value = function(*_operands(cell, function))
    node = cell.graph.node(value.node)
    assert node.op is ops.REGISTRY[name]
    assert node.loc is not None and __file__ in node.loc  # the user's line, not the DSL's


def test_signatures_name_the_operands() -> None:
    assert list(inspect.signature(rnnc.tanh).parameters) == ["x"]
    assert list(inspect.signature(rnnc.where).parameters) == ["cond", "a", "b"]
    cell = rnnc.Cell("keywords")
    x = cell.input("x", 2)
    value = rnnc.where(cond=x, a=1.0, b=x)
    assert cell.graph.node(value.node).op is ops.where
    with pytest.raises(TypeError):
        rnnc.tanh(x, x)


def test_concat_refuses_an_empty_list() -> None:
    with pytest.raises(rnnc.RnncValueError, match="concat takes a non-empty list"):
        rnnc.concat([])
