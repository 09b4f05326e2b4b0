"""A JSON cache of tuned kernel configurations, one file per (device, kernel source).

File: ``$ANYBIT_CACHE_DIR/tuning/<device key>/<kernel>-<source hash>.json`` holding
``{"anybit": version, "entries": {problem key: {"config": {...}, "us": float}}}``. The device key
is made from what changes the best tile (name, SM count, capability, memory clock and bus width),
the kernel's source hash retires entries when the kernel changes, and a new anybit version retires
the file. Writes take an exclusive lock, re-read, merge and `os.replace` a temporary file, so
concurrent tuners lose nothing and readers never see half a file. A corrupt or stale file is ignored
with one warning and rewritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import warnings

import anybit
from anybit import settings


def m_bucket(m: int) -> int:
    """The power of two >= m (1, 2, 4, …): tuned configurations are shared within a bucket."""
    return 1 << max(0, (m - 1).bit_length())


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
    """Hash of kernel sources (Triton JITFunctions or plain functions): a changed kernel is re-tuned."""
    h = hashlib.sha256()
    for obj in objects:
        src = getattr(obj, "src", None) or getattr(getattr(obj, "fn", None), "__code__", None)
        h.update(str(src).encode())
    return h.hexdigest()[:16]


class TuningCache:
    def __init__(self, kernel: str, src_hash: str, device: str, root: str | None = None):
        root = root or os.path.join(settings.load().cache_dir, "tuning")
        self.path = os.path.join(root, device, f"{kernel}-{src_hash}.json")
        self._entries: dict | None = None

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            warnings.warn(f"anybit: ignoring unreadable tuning cache {self.path} ({e}); it will be rewritten",
                          stacklevel=3)  # fmt: skip
            return {}
        if (
            not isinstance(data, dict)
            or data.get("anybit") != anybit.__version__
            or not isinstance(data.get("entries"), dict)
        ):
            warnings.warn(f"anybit: ignoring stale tuning cache {self.path} (other anybit version or layout)",
                          stacklevel=3)  # fmt: skip
            return {}
        return data["entries"]

    def get(self, key: str) -> dict | None:
        if self._entries is None:
            self._entries = self._read()
        entry = self._entries.get(key)
        return entry if isinstance(entry, dict) and isinstance(entry.get("config"), dict) else None

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
