"""Shared pytest options and fixtures."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite golden-text files instead of comparing against them")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when the run should rewrite golden files (review the diff before committing)."""
    return bool(request.config.getoption("--update-goldens"))
