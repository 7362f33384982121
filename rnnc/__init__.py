"""rnnc: a graph-rewriting compiler for recurrent neural network cells."""

from rnnc import cells, printer
from rnnc.api import Function, Grads, Tape, compile, dump
from rnnc.composites import hard_sigmoid, layer_norm, softsign
from rnnc.dsl import (
    Cell,
    Value,
    concat,
    exp,
    log,
    mean,
    relu,
    rsqrt,
    sigmoid,
    sqrt,
    sum,
    tanh,
    where,
)
from rnnc.errors import (
    BackendUnavailable,
    CellError,
    CheckError,
    RnncError,
    RnncTypeError,
    RnncValueError,
    ShapeError,
)
from rnnc.layers import RNN

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "Cell",
    "CellError",
    "CheckError",
    "Function",
    "Grads",
    "RNN",
    "RnncError",
    "RnncTypeError",
    "RnncValueError",
    "ShapeError",
    "Tape",
    "Value",
    "cells",
    "compile",
    "concat",
    "dump",
    "exp",
    "hard_sigmoid",
    "layer_norm",
    "log",
    "mean",
    "printer",
    "relu",
    "rsqrt",
    "sigmoid",
    "softsign",
    "sqrt",
    "sum",
    "tanh",
    "where",
]
