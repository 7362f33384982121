"""rnnc: a graph-rewriting compiler for recurrent neural network cells."""

from rnnc import cells, printer
from rnnc.api import Function, Grads, Tape, compile, dump
from rnnc.composites import hard_sigmoid, layer_norm, logsumexp, softmax, softsign
from rnnc.dsl import FUNCTIONS, Cell, Value
from rnnc.errors import (
    BackendUnavailable,
    CellError,
    CheckError,
    CheckWarning,
    RnncError,
    RnncTypeError,
    RnncValueError,
    ShapeError,
)
from rnnc.layers import RNN

# The DSL functions, one per op a cell calls by name (rnnc.tanh, rnnc.where, rnnc.concat, ...).
globals().update(FUNCTIONS)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "Cell",
    "CellError",
    "CheckError",
    "CheckWarning",
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
    "dump",
    "hard_sigmoid",
    "layer_norm",
    "logsumexp",
    "printer",
    "softmax",
    "softsign",
]
__all__ += sorted(FUNCTIONS)
