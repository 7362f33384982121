"""Private disk caches: where they live, and how an entry is written, read and checked.

Every file rnnc keeps between processes goes through this module: LLVM object code
(``<root>/llvm``), CUDA-emulation kernel libraries (``<root>/cuda-emulate``), the CUDA launch
paths tuned per GPU and shape (``<root>/cuda-tuning``) and the BLAS tuning file
(``<root>/blas.json``). ``<root>`` is ``$RNNC_CACHE_DIR``, else
``$XDG_CACHE_HOME/rnnc``, else ``~/.cache/rnnc`` (``docs/caches.md`` has the whole story).

- A directory is created with mode 0700 and used only if it is a directory owned by this user
  that neither group nor others may write. Otherwise nothing goes to disk: the caller keeps
  its data in memory and one :class:`CacheWarning` says why. There is no fallback to a shared
  temporary directory.
- A file is opened with ``O_NOFOLLOW`` and ``O_NONBLOCK`` and checked with ``fstat``: a regular
  file owned by this user, at most :data:`MAX_ENTRY_BYTES`. Anything else (a symlink, a FIFO,
  a directory, someone else's file, an oversized one) is discarded.
- A file is written to a fresh temporary file in the same directory and renamed over the
  target, so a reader sees the old file or the whole new one; the temporary file is removed
  on every failure.
- An entry (:class:`DiskCache`) records its kind, key and program fingerprint, the payload's
  size and SHA-256 and the caller's metadata, and ends with an HMAC-SHA256 of all of it under
  a random per-directory secret (``.rnnc-secret``, mode 0600). A read checks everything
  against the request, so another program's valid entry renamed to this key, or an edited
  entry with a recomputed checksum, is rejected. A rejected entry is deleted and the caller
  rebuilds it; reading never raises.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import struct
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rnnc import process

MAX_ENTRY_BYTES = 64 << 20  # larger entries are neither written nor read
# The default bound of one cache directory's entries, in MiB ($RNNC_DISK_CACHE_MB overrides).
DISK_CACHE_MB = process.DISK_CACHE_MB
MAGIC = b"RNNC-CACHE-ENTRY-2\n"
SUFFIX = ".entry"
SECRET_NAME = ".rnnc-secret"
_SECRET_BYTES = 32
_MAC_BYTES = 32
_HEADER_LENGTH = struct.Struct("<I")
_KEY = re.compile(r"[0-9a-f]{16,128}")
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))

_warned: set[str] = set()
_secrets: dict[str, tuple[tuple[int, int], bytes]] = {}


class CacheWarning(UserWarning):
    """A cache directory cannot be used: rnnc keeps what it compiles in memory instead."""


def default_root() -> Path:
    """The directory under which every rnnc cache lives (see the module docstring)."""
    configured = process.CACHE_DIR.value()
    if configured:
        return Path(configured).expanduser()
    base = process.XDG_CACHE_HOME.value() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rnnc"


def private_directory(root: str | os.PathLike, *parts: str) -> Path | None:
    """``root/parts...``, created 0700 where missing, or None (with one warning per
    directory) if it or any level from ``root`` down is not a private directory of this user.
    """
    path = Path(root)
    for level in ("", *parts):
        path = path / level if level else path
        problem = _make_private(path)
        if problem is not None:
            if str(path) not in _warned:
                _warned.add(str(path))
                warnings.warn(f"rnnc cache directory {path} cannot be used: {problem}; "
                              "compiled code stays in memory for this process only. Set "
                              "RNNC_CACHE_DIR to a directory of your own (mode 0700).",
                              CacheWarning, stacklevel=3)
            return None
    return path


def _make_private(path: Path) -> str | None:
    """Why ``path`` is not (or cannot be made) a private directory, or None if it is one."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(path)
    except OSError as err:
        return f"it cannot be created ({err.strerror or err})"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return f"it belongs to user id {info.st_uid}, not to this user ({os.geteuid()})"
    if info.st_mode & 0o022:
        return (f"group or others may write to it (mode {stat.S_IMODE(info.st_mode):o}); "
                f"run `chmod 700 {path}`")
    return None


def read_file(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of this user of at most ``limit`` bytes
    (default :data:`MAX_ENTRY_BYTES`); None if it is missing. Anything else found there is
    discarded (best effort) and None returned."""
    read = _read_regular(path, MAX_ENTRY_BYTES if limit is None else limit)
    return None if read is None else read[0]


def _read_regular(path: Path, limit: int, discard_bad: bool = True
                  ) -> tuple[bytes, os.stat_result] | None:
    """The bytes and status of the regular file ``path`` of this user, at most ``limit``
    bytes; None otherwise (anything else found there discarded if ``discard_bad``)."""
    bad = discard if discard_bad else (lambda path: None)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP), a directory, no permission
        bad(path)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit or \
                (hasattr(os, "geteuid") and info.st_uid != os.geteuid()):
            bad(path)
            return None
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks), info
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                bad(path)
                return None
    except OSError:
        bad(path)
        return None
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    """Remove ``path`` if possible (a file, a link, a FIFO or an empty directory)."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        try:
            os.rmdir(path)
        except OSError:
            pass
    except OSError:
        pass


def write_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (mode 0600); False if that is not possible."""
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)  # fails on a directory in the way: nothing is replaced
        return True
    except OSError:
        _remove(temporary)
        return False
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _secret(directory: Path) -> bytes | None:
    """This directory's HMAC key, created on first use; None if it cannot be had."""
    path = directory / SECRET_NAME
    for _ in range(3):
        try:
            identity = os.lstat(path)
        except FileNotFoundError:
            identity = None
        except OSError:
            return None
        if identity is not None:
            # Remembered per file: a secret deleted and made again is read again.
            known = _secrets.get(str(path))
            if known is not None and known[0] == (identity.st_dev, identity.st_ino):
                return known[1]
            read = _read_regular(path, _SECRET_BYTES)
            if read is not None and len(read[0]) == _SECRET_BYTES:
                _secrets[str(path)] = ((read[1].st_dev, read[1].st_ino), read[0])
                return read[0]
            discard(path)
        try:
            fd, temporary = tempfile.mkstemp(prefix=".secret.", suffix=".tmp", dir=directory)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(_SECRET_BYTES))
            # link() creates the name only if it is free: of two processes creating the
            # secret at once, one wins and both read the winner's key on the next round.
            os.link(temporary, path)
        except FileExistsError:
            pass
        except OSError:
            return None
        finally:
            _remove(temporary)
    return None


@dataclass(frozen=True)
class Entry:
    """A checked entry: the caller's metadata and payload."""

    meta: dict[str, Any]
    payload: bytes


class DiskCache:
    """Checked entries of one ``kind`` in the private directory ``root/subdirectory``
    (``root`` None: nothing on disk)."""

    def __init__(self, root: str | os.PathLike | None, kind: str, subdirectory: str = "") -> None:
        self.root = None if root is None else Path(root)
        self.subdirectory = subdirectory
        self.kind = kind

    @property
    def directory(self) -> Path | None:
        """The directory of the entries."""
        if self.root is None:
            return None
        return self.root / self.subdirectory if self.subdirectory else self.root

    def path(self, key: str) -> Path | None:
        """Where the entry for ``key`` lives (None when there is no disk cache)."""
        if not _KEY.fullmatch(key):
            raise ValueError(f"cache keys are 16 to 128 lowercase hex digits, got {key!r}")
        directory = self.directory
        return None if directory is None else directory / f"{key}{SUFFIX}"

    def _usable(self) -> Path | None:
        if self.root is None:
            return None
        parts = (self.subdirectory,) if self.subdirectory else ()
        return private_directory(self.root, *parts)

    def load(self, key: str, fingerprint: str) -> Entry | None:
        """The entry stored for ``key`` and ``fingerprint``, or None (a bad one is deleted)."""
        path = self.path(key)
        directory = self._usable()
        if path is None or directory is None:
            return None
        data = read_file(path)
        if data is None:
            return None
        secret = _secret(directory)
        entry = None if secret is None else self._decode(secret, data, key, fingerprint)
        if entry is None:
            discard(path)
        else:
            _touch(path)
        return entry

    def store(self, key: str, fingerprint: str, meta: dict[str, Any], payload: bytes) -> bool:
        """Write the entry for ``key``; False if it could not be written (never raises)."""
        path = self.path(key)
        directory = self._usable()
        if path is None or directory is None:
            return False
        secret = _secret(directory)
        if secret is None:
            return False
        header = json.dumps({"kind": self.kind, "key": key, "fingerprint": fingerprint,
                             "payload_bytes": len(payload),
                             "payload_sha256": hashlib.sha256(payload).hexdigest(),
                             "meta": meta}, sort_keys=True).encode()
        body = MAGIC + _HEADER_LENGTH.pack(len(header)) + header + payload
        data = body + hmac.new(secret, body, hashlib.sha256).digest()
        if len(data) > MAX_ENTRY_BYTES:
            return False
        if not write_file(path, data):
            return False
        trim(directory, disk_bound(), keep=path)
        return True

    def discard(self, key: str) -> None:
        """Delete the entry for ``key`` (one that decoded but could not be used)."""
        path = self.path(key)
        if path is not None:
            discard(path)

    def _decode(self, secret: bytes, data: bytes, key: str, fingerprint: str) -> Entry | None:
        start = len(MAGIC) + _HEADER_LENGTH.size
        if len(data) < start + _MAC_BYTES or not data.startswith(MAGIC):
            return None
        body, mac = data[:-_MAC_BYTES], data[-_MAC_BYTES:]
        if not hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).digest(), mac):
            return None
        (length,) = _HEADER_LENGTH.unpack_from(body, len(MAGIC))
        if start + length > len(body):
            return None
        try:
            header = json.loads(body[start:start + length])
        except (ValueError, RecursionError):
            return None
        payload = body[start + length:]
        expected = {"kind": self.kind, "key": key, "fingerprint": fingerprint,
                    "payload_bytes": len(payload),
                    "payload_sha256": hashlib.sha256(payload).hexdigest()}
        if not isinstance(header, dict) or not isinstance(header.get("meta"), dict) or \
                any(header.get(name) != value for name, value in expected.items()):
            return None
        return Entry(header["meta"], payload)


def disk_bound() -> int:
    """The bound of one cache directory's entries in bytes: ``$RNNC_DISK_CACHE_MB`` (MiB, a
    finite number >= 0) or :data:`DISK_CACHE_MB`; any other value (``inf``, ``nan``, ``-1``,
    ``lots``) warns once and is ignored, so that a store still never raises."""
    return int(process.env_mib(process.DISK_CACHE, DISK_CACHE_MB, CacheWarning) * (1 << 20))


def _touch(path: Path) -> None:
    """Mark an entry as just used (its modification time orders eviction)."""
    try:
        os.utime(path)
    except OSError:
        pass


def trim(directory: Path, bound: int, keep: Path | None = None) -> int:
    """Delete the least recently used entries of ``directory`` (by modification time: written
    or read) until their total size is at most ``bound`` bytes; never ``keep``, the entry
    just written. Returns the number deleted. Only rnnc's entries count (a key's name and
    rnnc's header), and a file goes only once its MAC under the directory's secret checks:
    another program's ``*.entry`` files, the secret and temporary files are left alone."""
    entries = []
    try:
        with os.scandir(directory) as found:
            for item in found:
                if item.name.endswith(SUFFIX) and _KEY.fullmatch(item.name[:-len(SUFFIX)]) \
                        and item.is_file(follow_symlinks=False):
                    info = item.stat(follow_symlinks=False)
                    entries.append((info.st_mtime_ns, info.st_size, Path(item.path)))
    except OSError:
        return 0
    if sum(size for _, size, _ in entries) <= bound:  # the usual case: nothing more to read
        return 0
    secret = _secret(directory)
    entries = [e for e in entries if _header(e[2]) == MAGIC]
    total, deleted = sum(size for _, size, _ in entries), 0
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= bound or secret is None:
            break
        if keep is not None and path == keep:
            continue
        total -= size  # counted no longer: deleted, or found not to be rnnc's
        if _written_by_rnnc(path, secret):
            discard(path)
            deleted += 1
    return deleted


def _header(path: Path) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(len(MAGIC))
    except OSError:
        return b""


def _written_by_rnnc(path: Path, secret: bytes) -> bool:
    """Whether ``path`` is an entry that rnnc wrote under ``secret`` (its MAC checks)."""
    read = _read_regular(path, MAX_ENTRY_BYTES, discard_bad=False)
    if read is None or len(read[0]) < len(MAGIC) + _MAC_BYTES or not read[0].startswith(MAGIC):
        return False
    body, mac = read[0][:-_MAC_BYTES], read[0][-_MAC_BYTES:]
    return hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).digest(), mac)
