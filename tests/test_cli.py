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
