"""Shared pytest options and fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Every hypothesis test draws the same examples on every run: a failure is reproducible and
# CI cannot pass by luck. (A test's own @settings add to this profile.)
settings.register_profile("rnnc", derandomize=True, database=None)
settings.load_profile("rnnc")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite golden-text files instead of comparing against them")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when the run should rewrite golden files (review the diff before committing)."""
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every rnnc cache (object code, emulation libraries, BLAS tuning) in a fresh directory
    for the whole run: tests never read the user's cache, so they cannot pass on stale code,
    and never write to it. Subprocesses inherit the setting."""
    root = tmp_path_factory.mktemp("rnnc-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RNNC_CACHE_DIR", str(root))
        yield root


@pytest.fixture
def runner_copies(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """The host<->device byte counts (``Runner.transfers``) of every CUDA runner call, in
    call order."""
    from rnnc.backends.cuda.runtime import Runner

    seen: list[dict[str, int]] = []
    for entry in ("__call__", "on_device"):
        original = getattr(Runner, entry)

        def counted(self, env, dims, original=original):
            results = original(self, env, dims)
            seen.append(dict(self.transfers))
            return results

        monkeypatch.setattr(Runner, entry, counted)
    return seen


@pytest.fixture
def team_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The team size of every LLVM thread-team call made while the test runs."""
    from rnnc.backends.llvm import pool

    calls: list[int] = []
    original = pool.run_team

    def counting(function, args, size):
        calls.append(size)
        return original(function, args, size)

    monkeypatch.setattr(pool, "run_team", counting)
    return calls
