"""The tuning cache: round trip, corruption and staleness recovery, concurrent writers, and the
Triton backend using a cached tile."""

import json
import multiprocessing as mp
import warnings
from pathlib import Path

import pytest
import torch

import anybit
from anybit.backends import get_backend
from anybit.tuning.autotune import autotune, candidates
from anybit.tuning.cache import TuningCache, device_key, m_bucket
from tests.tolerances import GEMM_REL_ERR, rel_err


def test_round_trip_keeps_the_fastest(tmp_path):
    c = TuningCache("gemm", "abc", "dev", str(tmp_path))
    assert c.get("k") is None
    c.put("k", {"block_n": 64}, 10.0)
    c.put("k", {"block_n": 128}, 12.0)  # slower: not kept
    assert TuningCache("gemm", "abc", "dev", str(tmp_path)).get("k") == {"config": {"block_n": 64}, "us": 10.0}
    assert TuningCache("gemm", "other-source", "dev", str(tmp_path)).get("k") is None  # kernel changed


def test_corrupt_and_stale_files_are_ignored_with_a_warning_and_rewritten(tmp_path):
    c = TuningCache("gemm", "abc", "dev", str(tmp_path))
    c.put("k", {"block_n": 64}, 10.0)
    with open(c.path, "w") as f:
        f.write("{ not json")
    fresh = TuningCache("gemm", "abc", "dev", str(tmp_path))
    with pytest.warns(UserWarning, match="unreadable tuning cache"):
        assert fresh.get("k") is None
    with pytest.warns(UserWarning, match="unreadable"):  # the locked re-read before writing sees it too
        fresh.put("k2", {"block_n": 32}, 5.0)
    assert json.loads(Path(c.path).read_text())["entries"]["k2"]["us"] == 5.0
    data = json.loads(Path(c.path).read_text())
    data["anybit"] = "0.0.0-old"
    with open(c.path, "w") as f:
        json.dump(data, f)
    with pytest.warns(UserWarning, match="stale"):
        assert TuningCache("gemm", "abc", "dev", str(tmp_path)).get("k2") is None


def _writer(root, tag):
    c = TuningCache("gemm", "abc", "dev", root)
    for i in range(25):
        c.put(f"{tag}-{i}", {"i": i}, float(i))


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), t)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entries = json.loads(Path(TuningCache("gemm", "abc", "dev", str(tmp_path)).path).read_text())["entries"]
    assert len(entries) == 50


def test_keys_buckets_and_autotune_picks_the_fastest():
    assert [m_bucket(m) for m in (1, 2, 3, 16, 17, 4096)] == [1, 2, 4, 16, 32, 4096]
    assert "/" not in device_key(type("P", (), {"name": "NVIDIA H200/x", "major": 9, "minor": 0})())
    from anybit.kernels.gemm import GemmConfig

    cands = candidates(GemmConfig(16, 128, 128, split_k=4))
    assert len(cands) >= 4 and len(set(cands)) == len(cands)
    times = {c: 10.0 + i for i, c in enumerate(cands)}
    times[cands[2]] = 1.0
    assert autotune(cands, lambda c: times[c]) == (cands[2], 1.0)
    assert autotune([cands[0], cands[1]], lambda c: 1 / 0 if c is cands[0] else 3.0) == (cands[1], 3.0)
    frag = candidates(GemmConfig(64, 128, 128, split_k=4), frag=True)
    assert {c.block_k for c in frag} == {128} and any(c.block_m == 32 for c in frag)  # its K block is fixed


def test_triton_backend_uses_a_cached_tile(interpret, tmp_path, monkeypatch):
    monkeypatch.setenv("ANYBIT_CACHE_DIR", str(tmp_path))
    qw = anybit.quantize(torch.randn(40, 256), "w4a16")
    from anybit.backends.triton import tuning_cache

    tuned = {
        "block_m": 16,
        "block_n": 64,  # w4a16 runs the fragment-layout kernel: 64 weight rows per 4 warps at least
        "block_k": 128,
        "split_k": 3,
        "group_m": 8,
        "num_warps": 4,
        "num_stages": 2,
        "pairs": None,
    }
    tuning_cache(torch.device("cpu")).put("w4a16:int4:g128:bf16|n40|k256|m16|float16", tuned, 1.0)
    p = anybit.prepare(qw, backend="triton")
    x = torch.randn(13, 256).half()
    y = get_backend("triton").gemm(x, p)
    assert p.data.configs[13].split_k == 3 and p.data.configs[13].block_n == 64
    assert rel_err(y, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.float16]


def test_shipped_tables_are_for_the_current_kernels():
    """A shipped table is found only under the kernels' source hash: after a kernel edit, re-run
    `anybit tune` on that GPU (or, where the compiled code of every measured path is unchanged, e.g. a
    new constexpr branch, rename the file and say so in the commit)."""
    import glob
    import os

    from anybit.backends.triton import gemm_source_hash
    from anybit.tuning.cache import SHIPPED_ROOT

    tables = glob.glob(os.path.join(SHIPPED_ROOT, "*", "gemm-*.json"))
    assert tables, "no shipped tuning table"
    want = f"gemm-{gemm_source_hash()}.json"
    stale = [t for t in tables if os.path.basename(t) != want]
    assert not stale, f"stale shipped tables (kernel source changed): {stale}; expected {want}"
