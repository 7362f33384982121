"""Scalar calls into the C math library, for the functions ``mathlib`` does not build in IR.

The rules call ``sin``, ``cos``, ``erf``, ``erfc`` and ``expm1`` here (and ``frem`` becomes a
call of ``fmod``); the host's libm computes them correctly rounded or within an ULP or two in
glibc (its manual's table of known maximum errors), with full range reduction for ``sin`` and
``cos`` (``sin(1e22)`` is right). A call is scalar, so a loop that makes one does not
vectorize: these ops cost about a libm call per element.

Object code names the functions, not their addresses, so it stays valid in the disk cache; the
JIT resolves the names in this process, where :func:`_publish` has given each its address.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import llvmlite.binding as llvm
from llvmlite import ir

# The functions the emitters may call, in float and double: C99's real functions of one or two
# arguments, all published, so that an op calling one more of them edits only its rule.
FUNCTIONS = ("sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh",
             "asinh", "acosh", "atanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
             "cbrt", "hypot", "pow", "fmod", "erf", "erfc", "lgamma", "tgamma")


def _publish() -> None:
    """Give the JIT the address of every function it may be asked to link."""
    library = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for name in FUNCTIONS:
        for symbol in (name, name + "f"):
            llvm.add_symbol(symbol, ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value)


_publish()


def call(builder: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """``name(*args)`` of libm in the type of ``args[0]`` (``sinf`` for float, ``sin`` for
    double)."""
    assert name in FUNCTIONS, name
    type_ = args[0].type
    assert not isinstance(type_, ir.VectorType), "libm calls are scalar"
    symbol = name + ("f" if isinstance(type_, ir.FloatType) else "")
    function = builder.module.globals.get(symbol)
    if function is None:
        function = ir.Function(builder.module, ir.FunctionType(type_, [type_] * len(args)),
                               symbol)
    return builder.call(function, list(args))
