"""Linear-layer GEMM shapes of a transformer from its Hugging Face `config.json`.

Dense layers are (N, K) = (out_features, in_features). MoE expert layers carry `experts` and `topk`
(the expert-stacked weight is experts x N x K; a token touches topk of them): gate and up are fused
into one N = 2·I GEMM, as serving engines run them.
"""

from __future__ import annotations

from anybit.bench.recipe import Shape
from anybit.errors import AnybitError


def _get(cfg: dict, *names: str, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    if default is not None:
        return default
    raise AnybitError(f"model config has none of {names}; keys present: {sorted(cfg)[:40]}")


def shapes_from_config(cfg: dict) -> list[Shape]:
    """Shapes of one decoder layer (Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss)."""
    cfg = cfg.get("text_config", cfg)
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    shapes: list[Shape] = []
    if cfg.get("q_lora_rank") or cfg.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        q_rank, kv_rank = int(cfg.get("q_lora_rank") or 0), int(cfg["kv_lora_rank"])
        rope, nope, v_dim = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
        if q_rank:
            shapes += [Shape("q_a", q_rank, hidden), Shape("q_b", heads * (nope + rope), q_rank)]
        shapes += [
            Shape("kv_a", kv_rank + rope, hidden),
            Shape("kv_b", heads * (nope + v_dim), kv_rank),
            Shape("o", hidden, heads * v_dim),
        ]
    else:
        shapes += [Shape("qkv", (heads + 2 * kv_heads) * head_dim, hidden), Shape("o", hidden, heads * head_dim)]
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    if experts:
        inter = int(_get(cfg, "moe_intermediate_size", "intermediate_size"))
        topk = int(_get(cfg, "num_experts_per_tok", "experts_per_token", "num_experts_per_token"))
        shapes += [
            Shape("experts.gate_up", 2 * inter, hidden, experts=experts, topk=topk),
            Shape("experts.down", hidden, inter, experts=experts, topk=topk),
        ]
        shared = int(cfg.get("n_shared_experts") or 0)
        if shared:
            shapes += [
                Shape("shared.gate_up", 2 * inter * shared, hidden),
                Shape("shared.down", hidden, inter * shared),
            ]
    else:
        inter = int(_get(cfg, "intermediate_size", "n_inner", default=4 * hidden))
        shapes += [Shape("gate_up", 2 * inter, hidden), Shape("down", hidden, inter)]
    return shapes
