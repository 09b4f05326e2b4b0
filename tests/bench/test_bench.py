"""anybit bench on the CPU: recipes, model shapes, provenance, the compare gate, an end-to-end run."""

import copy
import json

import pytest

from anybit.bench import Shape, load_recipe, shapes_from_config
from anybit.bench.main import run_bench
from anybit.bench.recipe import parse_recipe
from anybit.bench.report import compare
from anybit.cli import main as cli
from anybit.errors import AnybitError, SchemeError

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}


@pytest.mark.parametrize("name", ["default", "dense_a16", "fp8", "moe"])
def test_shipped_recipes_load(name):
    import os

    import anybit.bench

    path = os.path.join(os.path.dirname(anybit.bench.__file__), "recipes", f"{name}.yaml")
    r = load_recipe(path)
    assert r.shapes and r.schemes and r.m


@pytest.mark.parametrize("name", ["fp8", "dense_a16.yaml", "default"])
def test_shipped_recipes_by_name(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    assert load_recipe(name).source == name.removesuffix(".yaml") + ".yaml"


def test_unknown_recipe_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AnybitError, match="no shipped recipe of that name: .*'fp8'"):
        load_recipe("fp9")


def test_default_recipe_is_llama3_8b_layers():
    r = load_recipe()
    assert [(s.name, s.n, s.k) for s in r.shapes] == [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ]
    assert {"w4a16", "w8a16", "w4a8", "w8a8-fp8", "nvfp4", "mxfp4"} <= set(r.schemes)
    assert r.m[0] == 1 and r.m[-1] == 8192 and r.repeats % 2 == 1


def test_moe_configs():
    qwen3_moe = {
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
    }
    s = {x.name: x for x in shapes_from_config(qwen3_moe)}
    assert s["qkv"] == Shape("qkv", (32 + 8) * 128, 2048)
    assert s["experts.gate_up"] == Shape("experts.gate_up", 1536, 2048, experts=128, topk=8)
    assert s["experts.down"] == Shape("experts.down", 2048, 768, experts=128, topk=8)
    dsv3 = {
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
    }
    s = {x.name: x for x in shapes_from_config(dsv3)}
    assert s["experts.gate_up"] == Shape("experts.gate_up", 4096, 7168, experts=256, topk=8)
    assert s["experts.down"] == Shape("experts.down", 7168, 2048, experts=256, topk=8)
    assert s["kv_a"] == Shape("kv_a", 576, 7168) and s["q_b"] == Shape("q_b", 128 * 192, 1536)
    assert s["shared.down"] == Shape("shared.down", 7168, 2048)
    gpt_oss = {
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 128,
        "experts_per_token": 4,
        "intermediate_size": 2880,
    }
    s = {x.name: x for x in shapes_from_config(gpt_oss)}
    assert s["experts.gate_up"] == Shape("experts.gate_up", 5760, 2880, experts=128, topk=4)


def test_model_config_from_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA3_8B))
    (tmp_path / "r.yaml").write_text("model: m\nschemes: [w4a16]\nm: [1]\n")
    r = load_recipe(str(tmp_path / "r.yaml"))
    assert r.shapes[0] == Shape("qkv", 6144, 4096) and r.name == "r"


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"schemes": ["w4a16"], "m": [1]}, "give `shapes`"),
        ({"shapes": [{"name": "a", "n": 8}], "schemes": ["w4a16"], "m": [1]}, "a shape is"),
        ({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w4a16"], "m": [0]}, "positive integers"),
        ({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w4a16"], "m": [1], "repeats": 4}, "odd"),
        ({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w4a16"], "m": [1], "peers": ["x"]}, "valid"),
        ({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w4a16"], "m": [1], "tming": "x"}, "unknown"),
        ({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w4a16"], "m": [1], "timing": "x"}, "timing"),
    ],
)
def test_bad_recipes_say_what_is_valid(bad, match):
    with pytest.raises(AnybitError, match=match):
        parse_recipe(bad)


def test_bad_scheme_and_yaml(tmp_path):
    with pytest.raises(SchemeError):
        parse_recipe({"shapes": [{"name": "a", "n": 8, "k": 8}], "schemes": ["w9a16"], "m": [1]})
    p = tmp_path / "r.yaml"
    p.write_text("schemes: [w4a16\n")
    with pytest.raises(AnybitError, match="not valid YAML"):
        load_recipe(str(p))


def _tiny_recipe():
    return parse_recipe(
        {
            "name": "tiny",
            "shapes": [{"name": "a", "n": 128, "k": 256}],
            "schemes": ["w4a16", "w4a8:int4:g128:bf16:int8-token"],
            "m": [1, 3],
            "peers": ["torch-bf16", "humming"],
            "cpu": {"m": [1, 3]},
        }
    )


def test_cpu_run_end_to_end_and_compare_gate(tmp_path):
    res = run_bench(_tiny_recipe(), out_dir=str(tmp_path), quiet=True)
    env = res["env"]
    assert env["gpu"] == "none (CPU)" and len(env["recipe_sha256"]) == 64 and env["commit"]
    for key in ("date", "torch", "triton", "anybit", "seed"):
        assert key in env
    rows = res["rows"]
    anybit_rows = [r for r in rows if r["kind"] == "anybit"]
    assert len(anybit_rows) == 4 and all(r["status"] == "ok" and r["rel_err"] < 1e-2 for r in anybit_rows)
    assert all(len(r["eager_samples"]) == 3 for r in anybit_rows)
    hum = [r for r in rows if r["backend"] == "humming"]
    assert hum and all(r["status"].startswith("unsupported") for r in hum)  # said, not skipped
    assert (tmp_path / "bench.json").exists() and "| shape |" in (tmp_path / "bench.md").read_text()

    slow = copy.deepcopy(res)
    for r in slow["rows"]:
        if r.get("status") == "ok" and r["kind"] == "anybit" and r["m"] == 3:
            r["eager_us"] *= 1.10  # an injected 10 % slowdown
    cells, regressed = compare(res, slow, 0.05)
    assert regressed and sum(c["regressed"] for c in cells) == 2
    assert not compare(res, res, 0.05)[1]
    (tmp_path / "a.json").write_text(json.dumps(res, default=str))
    (tmp_path / "b.json").write_text(json.dumps(slow, default=str))
    assert cli(["bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--threshold", "5%"]) == 1
    assert cli(["bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    other = copy.deepcopy(res)
    other["env"]["gpu"] = "NVIDIA H100"
    with pytest.raises(AnybitError, match="gpu differs"):
        compare(res, other, 0.05)


def test_warm_up_runs_the_asked_count_on_the_cpu():
    """The timing warm-up: exactly the asked runs on the CPU (the GPU adds runs until WARM_S has passed)."""
    from anybit.bench.timing import _warm, time_eager

    ran = []
    _warm(lambda: ran.append(1), 3, cuda=False)
    assert len(ran) == 3
    calls = []
    samples = time_eager([lambda: calls.append(1)], calls=2, repeats=4, warmup=4, cuda=False)
    assert len(samples) == 4 and len(calls) == 2 * 2 + 4 * 2
