"""The disk caches are bounded: the least recently used entries go first, the one just
written and files that are not entries never do, and a bad bound is a warning."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest

from rnnc import diskcache, process


def _store(cache: diskcache.DiskCache, k: int, size: int) -> Path:
    key = f"{k:016x}"
    assert cache.store(key, "fp", {}, bytes(size))
    path = cache.path(key)
    assert path is not None and path.exists()
    return path


def _age(path: Path, seconds_ago: int) -> None:
    past = path.stat().st_mtime - seconds_ago
    os.utime(path, (past, past))


def test_writing_past_the_bound_deletes_the_least_recently_used(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", str(350_000 / 2**20))  # room for 3 entries, not 4
    cache = diskcache.DiskCache(tmp_path, "test")
    paths = [_store(cache, k, 100_000) for k in range(3)]
    for age, path in zip((300, 200, 100), paths, strict=True):
        _age(path, age)
    assert cache.load(f"{0:016x}", "fp") is not None  # reading entry 0 makes it the newest
    newest = _store(cache, 3, 100_000)
    left = {p.name for p in tmp_path.glob("*" + diskcache.SUFFIX)}
    assert newest.name in left and paths[0].name in left
    assert paths[1].name not in left  # the oldest unread entry went first
    assert sum((tmp_path / n).stat().st_size for n in left) <= diskcache.disk_bound()
    assert (tmp_path / diskcache.SECRET_NAME).exists()  # never an entry, never deleted


def test_a_zero_bound_keeps_only_the_entry_just_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", "0")
    cache = diskcache.DiskCache(tmp_path, "test")
    for k in range(3):
        last = _store(cache, k, 1000)
    assert [p.name for p in tmp_path.glob("*" + diskcache.SUFFIX)] == [last.name]
    assert cache.load(f"{2:016x}", "fp").payload == bytes(1000)


def test_other_files_are_left_alone(tmp_path) -> None:
    (tmp_path / "notes.txt").write_bytes(bytes(5000))
    (tmp_path / ".x.entry.123.tmp").write_bytes(bytes(5000))
    cache = diskcache.DiskCache(tmp_path, "test")
    _store(cache, 0, 1000)
    assert diskcache.trim(tmp_path, 0) == 1  # the one entry, nothing else
    assert (tmp_path / "notes.txt").exists() and (tmp_path / ".x.entry.123.tmp").exists()


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf", "1e400", "-inf"])
def test_a_bad_bound_warns_and_keeps_the_default(monkeypatch, value: str) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", value)
    monkeypatch.setattr(process, "_warned", set())
    with pytest.warns(diskcache.CacheWarning, match="RNNC_DISK_CACHE_MB"):
        assert diskcache.disk_bound() == diskcache.DISK_CACHE_MB << 20


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-5", "many"])
def test_a_store_under_a_bad_bound_never_raises(tmp_path, monkeypatch, value: str) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", value)
    monkeypatch.setattr(process, "_warned", set())
    cache = diskcache.DiskCache(tmp_path, "test")
    with pytest.warns(diskcache.CacheWarning, match="RNNC_DISK_CACHE_MB"):
        path = _store(cache, 0, 1000)
    assert cache.load(f"{0:016x}", "fp").payload == bytes(1000) and path.exists()


def test_a_huge_finite_bound_keeps_everything(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", "1e300")
    cache = diskcache.DiskCache(tmp_path, "test")
    paths = [_store(cache, k, 1000) for k in range(3)]
    assert all(p.exists() for p in paths)


def test_trimming_deletes_only_entries_rnnc_wrote(tmp_path, monkeypatch) -> None:
    cache = diskcache.DiskCache(tmp_path, "test")
    mine = [_store(cache, k, 1000) for k in range(2)]
    # Other programs' files that look like entries: a name that is no rnnc key, a key-shaped
    # name with rnnc's header but no valid MAC, and one with a MAC under another secret.
    foreign = {"notes.entry": bytes(5000),
               f"{7:016x}.entry": diskcache.MAGIC + bytes(5000),
               f"{8:016x}.entry": diskcache.MAGIC + bytes(100) + hmac.new(
                   b"another secret", diskcache.MAGIC + bytes(100), hashlib.sha256).digest()}
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
        _age(tmp_path / name, 1000)  # older than rnnc's: first in line
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", "0")
    newest = _store(cache, 2, 1000)
    assert all((tmp_path / name).read_bytes() == data for name, data in foreign.items())
    assert newest.exists() and not any(p.exists() for p in mine)


def test_other_programs_files_do_not_count_against_the_bound(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RNNC_DISK_CACHE_MB", str(5000 / 2**20))  # room for rnnc's two entries
    cache = diskcache.DiskCache(tmp_path, "test")
    first = _store(cache, 0, 1000)
    (tmp_path / f"{9:016x}.entry").write_bytes(bytes(1 << 20))  # newer, large, not rnnc's
    second = _store(cache, 1, 1000)
    assert first.exists() and second.exists()
    assert (tmp_path / f"{9:016x}.entry").stat().st_size == 1 << 20
