"""GPU: the humming backend runs our quantized weights exactly; `anybit tune` fills the cache and
"auto" then picks the backend it measured fastest."""

import importlib.util

import pytest
import torch

import anybit
from anybit.backends.base import Problem
from anybit.backends.registry import choose_with_reason, measured_us
from anybit.bench.recipe import parse_recipe
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu
needs_humming = pytest.mark.skipif(importlib.util.find_spec("humming") is None, reason="humming-kernels not installed")

# activation dtype per scheme: humming keeps bf16/fp16 scales in the activation dtype
CASES = [
    ("w4a16", torch.bfloat16),
    ("w4a16-zp", torch.float16),
    ("w2a16", torch.float16),
    ("w8a16", torch.bfloat16),
    ("nvfp4", torch.bfloat16),
    ("mxfp4", torch.bfloat16),
    ("w4a8:int4:g128:bf16:e4m3-token", torch.bfloat16),
    ("w8a8:e4m3:ch:bf16:e4m3-token", torch.bfloat16),
]


@needs_humming
@pytest.mark.parametrize("scheme,dtype", CASES)
@pytest.mark.parametrize("m", [1, 13, 257])
def test_humming_backend_matches_the_exact_path(scheme, dtype, m):
    torch.manual_seed(0)
    qw = anybit.quantize(torch.randn(512, 1024, device="cuda") * 0.05, scheme)
    x = torch.randn(m, 1024, device="cuda", dtype=dtype)
    y = anybit.gemm(x, anybit.prepare(qw, backend="humming"))
    ref = anybit.gemm(x, anybit.prepare(qw, backend="torch"))
    # FP8 activations: each side quantizes x itself (rounding may differ by one FP8 step)
    tol = 3e-2 if qw.scheme.act.quantized else GEMM_REL_ERR[dtype]
    assert y.dtype == dtype and rel_err(y, ref) < tol


def test_tune_fills_the_cache_and_auto_follows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYBIT_CACHE_DIR", str(tmp_path))
    from anybit.tuning.tune import run_tune

    recipe = parse_recipe(
        {
            "name": "t",
            "shapes": [{"name": "sq", "n": 2048, "k": 2048}],
            "schemes": ["w4a16"],
            "m": [1, 64],
            "repeats": 3,
            "warmup": 2,
            "graph_calls": 4,
        }  # fmt: skip
    )
    rows = run_tune(recipe, write_to=str(tmp_path / "tables"))
    assert all(r["us"].get("triton") for r in rows), rows
    for r in rows:
        p = Problem(anybit.Scheme.parse("w4a16"), 2048, 2048, r["m"], torch.device("cuda"), torch.bfloat16)
        times = measured_us(p)
        name, why = choose_with_reason(p)
        assert name == min(times, key=times.get) and "measured fastest" in why
    assert list((tmp_path / "tables").glob("*/gemm-*.json"))


def test_explain_moe_prints_the_plan_the_layer_runs(capsys):
    """`anybit explain --moe` on the GPU: DeepSeek-V3 w4a16 at 4096 tokens (128 rows an expert) takes the wide
    prefill blocks of 144 = 128 + 16 rows by 256 weight rows (`WIDE_BLOCKS`, session 43) with PDL; one token splits
    K (decode) and keeps 16-row blocks."""
    from anybit.cli import main

    assert main(["explain", "--scheme", "w4a16", "--moe", "256,8", "--shape", "4096,7168,2048"]) == 0
    out = capsys.readouterr().out
    assert "grouped Triton GEMMs" in out and "kind 'wide'" in out
    assert "144 rows x 256 weight rows" in out and "blocks of 128 + 16 rows" in out and "PDL" in out
    assert main(["explain", "--scheme", "w4a16", "--moe", "256,8", "--shape", "1,7168,2048"]) == 0
    out = capsys.readouterr().out
    assert "16 rows x" in out and "half-width" not in out
