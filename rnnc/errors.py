"""Errors raised by rnnc: every bad input becomes one of these before native code runs."""

from __future__ import annotations

import pickle


class RnncError(Exception):
    """Base class of every error rnnc raises on purpose."""


class RnncValueError(RnncError, ValueError):
    """A value with the wrong shape, size, length or name."""


class RnncTypeError(RnncError, TypeError):
    """A value of the wrong kind or dtype."""


class ShapeError(RnncValueError):
    """An op applied to incompatible shapes (reported at the DSL line that built it)."""


class CellError(RnncValueError):
    """A malformed cell: a name used twice, a state never updated, a missing output."""


class BackendUnavailable(RnncError, RuntimeError):
    """The requested backend cannot run here (no library, no device)."""


class CheckError(RnncError, RuntimeError):
    """``compile(..., check=True)`` found the compiled function disagreeing with the oracle."""


class RnncRuntimeError(RnncError, RuntimeError):
    """A value that does not fit the computation (where torch raises RuntimeError: a size
    mismatch between an input and the module, an empty sequence)."""


class RnncPicklingError(RnncError, pickle.PicklingError):
    """An object that cannot be pickled, such as a layer whose cell factory is a lambda."""


class CheckWarning(UserWarning):
    """``compile(..., check=True)`` found something that is not a fault: a cell whose float32
    results differ from its float64 ones by more than float32 rounding of a few steps."""
