import subprocess
import sys

from anybit.cli import main
from anybit.tools.formats import dtype_rows, preset_rows


def test_formats_command_prints_tables(capsys):
    assert main(["formats", "--group-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "e2m1" in out and "nvfp4" in out and "w4a16:int4:g128:bf16" in out


def test_formats_rows():
    rows = {r["dtype"]: r for r in dtype_rows(128)}
    assert rows["int4"]["bytes_per_weight"] == (4 + 16 / 128) / 8
    assert "e4m3 exact" in rows["int4"]["activations"] and "e4m3" not in rows["int8"]["activations"]
    assert rows["e2m1"]["max"] == 6 and rows["e2m1"]["step"] == 0.5
    presets = {r["preset"]: r for r in preset_rows(4096)}
    assert presets["mxfp4"]["bits_per_weight"] == 4.25


def test_console_script_help_and_version():
    out = subprocess.run([sys.executable, "-m", "anybit.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "formats" in out.stdout
    out = subprocess.run([sys.executable, "-m", "anybit.cli", "--version"], capture_output=True, text=True)
    assert out.stdout.startswith("anybit ")


def test_explain_command_names_every_backend_and_the_pick(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["explain", "--scheme", "nvfp4", "--shape", "16,8192,8192", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "torch" in out and "auto picks: torch" in out
    assert "needs a CUDA GPU or TRITON_INTERPRET=1" in out


def test_explain_bad_shape_is_a_clear_error(capsys):
    assert main(["explain", "--scheme", "w4a16", "--shape", "16,8192"]) == 2
    assert "M,N,K" in capsys.readouterr().err


def test_explain_moe_says_grouped_or_loop_and_why(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the grouped path's Triton kernels run on this CPU
    assert main(["explain", "--scheme", "fp8-block", "--moe", "16,2", "--shape", "64,512,256", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "E=16 top-2, 64 tokens (128 rows, 8.0 per expert)" in out and "grouped Triton GEMMs" in out
    assert "gate_up N=512 K=512: FP8 as stored" in out and "down    N=512 K=256" in out
    assert "separate silu*mul" in out and "kind 'fp8-block'" in out  # 128x128 scale blocks span gate/up rows
    assert out.count("N tiles first") == 2  # unsplit aligned launches (`moe_n_first`)
    assert "blocks: rows an expert ~ Binomial(64, 2/16), mean 8.0; 16-row blocks:" in out
    assert main(["explain", "--scheme", "w4a16", "--moe", "16,2", "--shape", "3,512,256", "--device", "cpu"]) == 0
    out = capsys.readouterr().out  # a few tokens: slot blocks, no alignment, the top-k sum in the down GEMM
    assert "on the top-k ids as given" in out and "top-k weights and their sum per token" in out
    assert "N tiles first" not in out  # slot blocks keep blocks first
    assert main(["explain", "--scheme", "w4a16", "--moe", "8,2", "--shape", "4,512,256", "--device", "cpu"]) == 0
    assert "8 token x slot rows > 4: blocks a slot" in capsys.readouterr().out  # few experts: at most half of them
    assert main(["explain", "--scheme", "w8a8:e4m3:ch:fp32:e4m3-static", "--moe", "16,2", "--shape", "4,512,256",
                 "--device", "cpu"]) == 0  # fmt: skip
    assert "per-expert loop" in capsys.readouterr().out  # static scales differ per expert
    assert main(["explain", "--scheme", "w4a16", "--moe", "16", "--shape", "4,512,256"]) == 2
    assert "--moe E,TOPK" in capsys.readouterr().err


def test_explain_says_mxfp4_under_fp8_x_runs_on_the_fp8_mma_where_the_weight_allows(monkeypatch):
    """The plan of `explain` follows ANYBIT_E2M1_A8: the look-up-table FP8 path (and its tile), or x's codes on the
    A16 MMA; NVFP4 under FP8 x always the codes."""
    import torch

    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    def plan(text):
        return triton_plan(Scheme.parse(text), 16, 8192, 8192, torch.device("cpu"), torch.bfloat16)

    assert "on the FP8 MMA where" in plan("w4a8-mxfp4") and "look-up tables" in plan("w4a8-mxfp4")
    assert "FP8 MMA" not in plan("w4a8-nvfp4") and "their codes in x's dtype" in plan("w4a8-nvfp4")
    monkeypatch.setenv("ANYBIT_E2M1_A8", "0")
    assert "FP8 MMA" not in plan("w4a8-mxfp4") and "their codes in x's dtype" in plan("w4a8-mxfp4")
