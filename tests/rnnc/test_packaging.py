"""Packaging: the subpackages import under their installed names and rnnc exports the pinned API."""

from __future__ import annotations

import importlib
import pathlib

import pytest

import rnnc

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The public API (docs/architecture.md, "Public API"): the names the README's examples use.
PINNED = [
    "Cell", "compile", "dump", "cells", "sigmoid", "tanh", "relu", "exp", "log", "sqrt",
    "where", "concat", "mean", "sum", "softsign", "layer_norm", "hard_sigmoid", "RnncError",
]
FUNCTION_METHODS = ["__call__", "forward", "backward", "ir", "op_counts", "pack", "unpack"]


@pytest.mark.parametrize("name", PINNED)
def test_rnnc_exports_pinned_name(name: str) -> None:
    assert hasattr(rnnc, name), f"rnnc does not export {name!r}"
    assert name in rnnc.__all__, name


def test_all_names_resolve() -> None:
    missing = [n for n in rnnc.__all__ if not hasattr(rnnc, n)]
    assert not missing, missing


def test_standard_cells() -> None:
    for factory in ("rnn", "lstm", "gru"):
        assert callable(getattr(rnnc.cells, factory))
    assert isinstance(rnnc.cells.lstm(2, 3), rnnc.Cell)


@pytest.mark.parametrize("method", FUNCTION_METHODS)
def test_compiled_function_api(method: str) -> None:
    fn = rnnc.compile(rnnc.cells.rnn(2, 3), backend="numpy")
    assert isinstance(fn, rnnc.Function)
    assert callable(getattr(fn, method))


def test_cell_api() -> None:
    for method in ("input", "state", "param", "update", "output", "init_params", "program"):
        assert callable(getattr(rnnc.Cell, method)), method


@pytest.mark.parametrize("module, folder", [("rnnc.passes", "passes"),
                                            ("rnnc.backends", "backends")])
def test_subpackages_import_from_their_folders(module: str, folder: str) -> None:
    mod = importlib.import_module(module)
    path = pathlib.Path(mod.__file__).resolve()
    # Installed through setuptools package-dir: the module lives in the top-level folder.
    assert path.parent.name == folder, path
    if (ROOT / folder).is_dir():
        assert path.parent == ROOT / folder, path


def test_errors_are_standard_exceptions() -> None:
    assert issubclass(rnnc.RnncValueError, ValueError)
    assert issubclass(rnnc.RnncTypeError, TypeError)
    assert issubclass(rnnc.ShapeError, rnnc.RnncError)
    assert issubclass(rnnc.CellError, ValueError)
    assert issubclass(rnnc.BackendUnavailable, rnnc.RnncError)


def test_version() -> None:
    assert isinstance(rnnc.__version__, str) and rnnc.__version__.count(".") >= 1
