"""Where and with what a bench run was measured, recorded in its JSON so results can be compared."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone

import torch

import anybit


def _run(cmd: list[str], cwd: str | None = None) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    """ANYBIT_COMMIT (for copies without .git), else the checkout's HEAD, else 'unknown'."""
    env = os.environ.get("ANYBIT_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(anybit.__file__))
    head = _run(["git", "rev-parse", "--short", "HEAD"], cwd=here)
    if head and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here):
        head += "-dirty"
    return head or "unknown"


def provenance(device: torch.device, recipe_sha256: str | None = None, seed: int | None = None) -> dict:
    """Where and with what a measurement ran: date, versions, commit, GPU and its clocks (a recipe's hash
    and seed when a recipe drove it)."""
    import triton

    env = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "anybit": anybit.__version__,
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if recipe_sha256 is not None:
        env.update(recipe_sha256=recipe_sha256, seed=seed)
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            gpu=p.name,
            sm_count=p.multi_processor_count,
            capability=f"sm_{p.major}{p.minor}",
            memory_gib=round(p.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        )
        q = "driver_version,clocks.max.sm,clocks.max.memory,clocks.sm,clocks.mem,power.limit"
        smi = _run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-i", str(device.index or 0)])
        if smi:
            env["nvidia_smi"] = dict(zip(q.split(","), (v.strip() for v in smi.split(",")), strict=False))
    else:
        env.update(gpu="none (CPU)", cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env
