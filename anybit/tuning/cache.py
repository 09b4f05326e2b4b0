"""A JSON cache of tuned kernel configurations, one file per (device, kernel source).

File: ``$ANYBIT_CACHE_DIR/tuning/<device key>/<kernel>-<source hash>.json`` holding
``{"anybit": version, "entries": {problem key: {"config": {...}, "us": float}}}``. The device key
is made from what changes the best tile (name, SM count, capability, memory clock and bus width),
the kernel's source hash retires entries when the kernel changes, and a new anybit version retires
the file. Writes take an exclusive lock, re-read, merge and `os.replace` a temporary file, so
concurrent tuners lose nothing and readers never see half a file. A corrupt or stale file is ignored
with one warning and rewritten.

Measured tables ship in the package (``anybit/tuning/tables/<device key>/<kernel>-<hash>.json``, same
format, written by ``anybit tune``): a lookup tries the user's cache first, then the shipped table of
this exact device and kernel source. Besides tiles, a table records each backend's measured time per
problem (``<problem key>|backend=<name>``), which "auto" reads to prefer the fastest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import re
import tempfile
import textwrap
import warnings

import anybit
from anybit import settings


def m_bucket(m: int) -> int:
    """The power of two >= m (1, 2, 4, …): tuned configurations are shared within a bucket."""
    return 1 << max(0, (m - 1).bit_length())


SHIPPED_ROOT = os.path.join(os.path.dirname(__file__), "tables")


def problem_key(scheme, n: int, k: int, m: int, dtype) -> str:
    """The tuning cache's key of one GEMM problem: scheme, N, K, M bucket, activation dtype."""
    return f"{scheme}|n{n}|k{k}|m{m_bucket(m)}|{str(dtype).replace('torch.', '')}"


def backend_key(problem: str, backend: str) -> str:
    return f"{problem}|backend={backend}"


def device_key(props) -> str:
    """A file-name-safe key from a `torch.cuda.get_device_properties` result (or any object with
    those attributes)."""
    parts = [
        getattr(props, "name", "cpu"),
        f"sm{getattr(props, 'major', 0)}{getattr(props, 'minor', 0)}",
        f"{getattr(props, 'multi_processor_count', 0)}sm",
        f"{getattr(props, 'memory_clock_rate', 0)}khz",
        f"{getattr(props, 'memory_bus_width', 0)}bit",
    ]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts))


def source_hash(*objects) -> str:
    """Hash of kernel sources (Triton JITFunctions, interpreted ones, or plain functions): a changed
    kernel is re-tuned. The text from its `def` on, as Triton keeps it, so the hash is the same with and
    without TRITON_INTERPRET and in every process."""
    h = hashlib.sha256()
    for obj in objects:
        src = getattr(obj, "src", None)
        if src is None:
            src = textwrap.dedent(inspect.getsource(getattr(obj, "fn", obj)))
            start = re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE)
            src = src[start.start() :] if start else src
        h.update(src.encode())
    return h.hexdigest()[:16]


class TuningCache:
    def __init__(self, kernel: str, src_hash: str, device: str, root: str | None = None, shipped: str | None = None):
        root = root or os.path.join(settings.load().cache_dir, "tuning")
        name = os.path.join(device, f"{kernel}-{src_hash}.json")
        self.path = os.path.join(root, name)
        self.shipped_path = os.path.join(shipped or SHIPPED_ROOT, name)
        self._entries: dict | None = None
        self._shipped: dict | None = None

    def _read(self, path: str | None = None) -> dict:
        path = path or self.path
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            warnings.warn(f"anybit: ignoring unreadable tuning cache {path} ({e}); it will be rewritten",
                          stacklevel=3)  # fmt: skip
            return {}
        if (
            not isinstance(data, dict)
            or data.get("anybit") != anybit.__version__
            or not isinstance(data.get("entries"), dict)
        ):
            warnings.warn(f"anybit: ignoring stale tuning cache {path} (other anybit version or layout)",
                          stacklevel=3)  # fmt: skip
            return {}
        return data["entries"]

    def get(self, key: str) -> dict | None:
        """The user's entry for `key`, else the shipped table's, else None."""
        if self._entries is None:
            self._entries = self._read()
        if self._shipped is None:
            self._shipped = self._read(self.shipped_path)
        for entries in (self._entries, self._shipped):
            entry = entries.get(key)
            if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
                return entry
        return None

    def entries(self) -> dict:
        """Every entry, the user's over the shipped table's (what `anybit tune` writes out)."""
        self.get("")
        return {**self._shipped, **self._entries}

    def put(self, key: str, config: dict, us: float) -> None:
        """Record `config` for `key` unless a faster one is already there (any process's)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with self._locked():
            entries = self._read()
            old = entries.get(key)
            if not (isinstance(old, dict) and old.get("us", float("inf")) <= us):
                entries[key] = {"config": config, "us": us}
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"anybit": anybit.__version__, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            self._entries = entries

    @contextlib.contextmanager
    def _locked(self):
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
