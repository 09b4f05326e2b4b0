"""One converter per checkpoint family: its tensors (as the format's own tooling writes them) ->
`QuantizedWeight`, exactly. Each takes the reader, the module prefix and the quantization config."""

from __future__ import annotations

import torch

from anybit.errors import CheckpointError
from anybit.formats.scheme import Scheme
from anybit.quant.packing import pack_bits, unpack_bits
from anybit.quant.weights import QuantizedWeight

_SCALE_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8*w + AWQ_ORDER[i]


def _unpack_rows(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """int32 [..., words] bit streams (LSB first) -> uint8 codes [..., count]."""
    return unpack_bits(words.contiguous(), bits, count)


# ---- GPTQ --------------------------------------------------------------------------------------
def gptq(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, torch.Tensor | None]:
    """AutoGPTQ / GPTQModel: qweight int32 [K*b/32, N] (bit stream along K), qzeros int32
    [G, N*b/32] (along N), scales fp16 [G, N], g_idx [K]. v1 checkpoints store zero - 1.
    desc_act (act-order): K is permuted so every group is contiguous; the permutation is returned and
    the activations must be permuted the same way (x[..., perm])."""
    bits = int(cfg.get("bits", 4))
    if bits not in (2, 3, 4, 8):
        raise CheckpointError(f"{prefix}: GPTQ bits={bits}; supported: 2, 3, 4, 8")
    scales = reader.get(f"{prefix}.scales", dtype=None)
    groups, n = scales.shape
    qweight = reader.get(f"{prefix}.qweight", (None, n), torch.int32)
    k = qweight.shape[0] * 32 // bits
    qzeros = reader.get(f"{prefix}.qzeros", (groups, (n * bits + 31) // 32), torch.int32)
    if k % groups:
        raise CheckpointError(f"{prefix}: K={k} does not split into {groups} groups")
    g = k // groups
    codes = _unpack_rows(qweight.t(), bits, k)  # [N, K]
    zeros = _unpack_rows(qzeros, bits, n).t().to(torch.int16)  # [N, G]
    if cfg.get("checkpoint_format", "gptq") != "gptq_v2":
        zeros = zeros + 1  # v1 stores zero - 1 (a zero of 0 was stored as 2**b - 1 and means 2**b)
    perm = None
    if f"{prefix}.g_idx" in reader:
        g_idx = reader.get(f"{prefix}.g_idx", (k,)).long()
        if not torch.equal(g_idx, torch.arange(k) // g):
            perm = torch.argsort(g_idx, stable=True)
            if not torch.equal(g_idx[perm], torch.arange(k) // g):
                raise CheckpointError(f"{prefix}: g_idx does not give every group {g} columns")
            codes = codes[:, perm]
    scales_t = scales.t().contiguous()
    sdt = _SCALE_DTYPES.get(scales.dtype)
    if sdt is None:
        raise CheckpointError(f"{prefix}.scales is {scales.dtype}; expected float16, bfloat16 or float32")
    mid = 1 << (bits - 1)
    if bool((zeros == mid).all()):  # symmetric: signed codes, no zero points (the fast kernels' case)
        scheme = Scheme.parse(f"w{bits}a16:int{bits}:{_gran(g, k)}:{sdt}")
        qw = QuantizedWeight(scheme, (n, k), pack_bits((codes.long() ^ mid), bits), scales_t)
    else:
        scheme = Scheme.parse(f"w{bits}a16:uint{bits}:{_gran(g, k)}:{sdt}:zp-int")
        qw = QuantizedWeight(scheme, (n, k), pack_bits(codes, bits), scales_t, zeros=zeros.to(torch.uint8))
    return qw, perm


def _gran(g: int, k: int) -> str:
    return "ch" if g == k else f"g{g}"


# ---- AWQ ---------------------------------------------------------------------------------------
def awq(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, None]:
    """AutoAWQ GEMM layout: qweight int32 [K, N/8] and qzeros int32 [G, N/8] packed along N with
    the interleaved nibble order AWQ_ORDER; scales fp16 [G, N]; w = (q - z) * s."""
    bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
    if bits != 4:
        raise CheckpointError(f"{prefix}: AWQ bits={bits}; the GEMM layout is 4-bit")
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise CheckpointError(f"{prefix}: AWQ version {version!r}; supported: 'gemm'")
    scales = reader.get(f"{prefix}.scales")
    groups, n = scales.shape
    qweight = reader.get(f"{prefix}.qweight", (None, n // 8), torch.int32)
    k = qweight.shape[0]
    qzeros = reader.get(f"{prefix}.qzeros", (groups, n // 8), torch.int32)
    codes = _awq_unpack(qweight).t().contiguous()  # [N, K]
    zeros = _awq_unpack(qzeros).t().contiguous()  # [N, G]
    g = k // groups
    sdt = _SCALE_DTYPES.get(scales.dtype)
    if sdt is None:
        raise CheckpointError(f"{prefix}.scales is {scales.dtype}; expected float16, bfloat16 or float32")
    scheme = Scheme.parse(f"w4a16:uint4:{_gran(g, k)}:{sdt}:zp-int")
    qw = QuantizedWeight(scheme, (n, k), pack_bits(codes, 4), scales.t().contiguous(), zeros=zeros)
    return qw, None


def _awq_unpack(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] -> uint8 [R, C] in column order."""
    w = words.long() & 0xFFFFFFFF
    out = torch.empty(w.shape[0], w.shape[1] * 8, dtype=torch.uint8)
    for i, col in enumerate(AWQ_ORDER):
        out[:, col::8] = ((w >> (4 * i)) & 0xF).to(torch.uint8)
    return out


# ---- FP8 (DeepSeek-V3 blocks, per channel, per tensor) -----------------------------------------
def fp8(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, None]:
    """weight float8_e4m3fn [N, K] with weight_scale_inv fp32 [ceil(N/bn), ceil(K/bk)]
    (`weight_block_size`) or weight_scale fp32 ([N, 1], [N] or []): w = fp8 * scale."""
    w = reader.get(f"{prefix}.weight", dtype=torch.float8_e4m3fn)
    n, k = w.shape
    act = "e4m3-token" if cfg.get("activation_scheme", "dynamic") == "dynamic" else "e4m3-static"
    block = cfg.get("weight_block_size")
    if block:
        bn, bk = (int(v) for v in block)
        s = reader.get(f"{prefix}.weight_scale_inv", (-(-n // bn), -(-k // bk)), torch.float32)
        act = f"e4m3-g{bk}" if act == "e4m3-token" else act
        scheme = Scheme.parse(f"w8a8:e4m3:b{bn}x{bk}:fp32:{act}")
    else:
        s = reader.get(f"{prefix}.weight_scale", dtype=torch.float32)
        if s.numel() == 1:
            s, gran = s.reshape(1, 1), "tensor"
        elif s.numel() == n:
            s, gran = s.reshape(n, 1), "ch"
        else:
            raise CheckpointError(f"{prefix}.weight_scale has shape {tuple(s.shape)}; expected [], [N] or [N, 1]")
        scheme = Scheme.parse(f"w8a8:e4m3:{gran}:fp32:{act}")
    codes = w.view(torch.uint8)
    return QuantizedWeight(scheme, (n, k), pack_bits(codes, 8), s.contiguous()), None


# ---- ModelOpt NVFP4 ----------------------------------------------------------------------------
def nvfp4(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, None]:
    """NVIDIA ModelOpt NVFP4: weight uint8 [N, K/2] (two e2m1 codes a byte, even k in the low
    nibble), weight_scale float8_e4m3fn [N, K/16], weight_scale_2 fp32 []: w = q * s * s2."""
    packed = reader.get(f"{prefix}.weight", dtype=torch.uint8)
    n, k = packed.shape[0], packed.shape[1] * 2
    s = reader.get(f"{prefix}.weight_scale", (n, k // 16), torch.float8_e4m3fn)
    s2 = reader.get(f"{prefix}.weight_scale_2", dtype=torch.float32).reshape(())
    codes = _nibbles(packed)
    scheme = Scheme.parse("nvfp4")
    return QuantizedWeight(scheme, (n, k), pack_bits(codes, 4), s.view(torch.uint8), global_scale=s2), None


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., B] -> uint8 [..., 2B]: low nibble first."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


# ---- gpt-oss MXFP4 -----------------------------------------------------------------------------
def mxfp4(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, None]:
    """gpt-oss: `{prefix}_blocks` uint8 [*lead, N, K/32, 16] (32 e2m1 codes a block, low nibble
    first) and `{prefix}_scales` uint8 [*lead, N, K/32] (ue8m0, 2**(s - 127))."""
    blocks = reader.get(f"{prefix}_blocks", dtype=torch.uint8)
    if blocks.dim() < 3 or blocks.shape[-1] != 16:
        raise CheckpointError(f"{prefix}_blocks has shape {tuple(blocks.shape)}; expected [..., N, K/32, 16]")
    lead, n, nb = tuple(blocks.shape[:-3]), blocks.shape[-3], blocks.shape[-2]
    scales = reader.get(f"{prefix}_scales", (*lead, n, nb), torch.uint8)
    codes = _nibbles(blocks).reshape(*lead, n, nb * 32)
    scheme = Scheme.parse("mxfp4")
    return QuantizedWeight(scheme, (*lead, n, nb * 32), pack_bits(codes, 4), scales.contiguous()), None


# ---- compressed-tensors ------------------------------------------------------------------------
CT_FORMATS = "pack-quantized, naive-quantized, float-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized"


def compressed_tensors(reader, prefix: str, cfg: dict) -> tuple[QuantizedWeight, torch.Tensor | None]:
    """llm-compressor's compressed-tensors: `pack-quantized` (int1-8 packed along K, +2**(b-1)
    offset, zero points packed along N), `naive-quantized` (int8 as is), `float-quantized` (FP8 e4m3
    per tensor / channel / block). w = (q - zp) * scale. Group act-order via `weight_g_idx`."""
    group = cfg["_group"]
    wa = group["weights"]
    fmt = group.get("format") or cfg.get("format")
    bits, kind, sym = int(wa["num_bits"]), wa.get("type", "int"), wa.get("symmetric", True)
    strategy = wa.get("strategy", "tensor")
    act = _ct_act(group.get("input_activations"), prefix)
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        return _ct_fp4(reader, prefix, fmt, act), None
    if fmt == "float-quantized":
        if kind != "float" or bits != 8:
            raise CheckpointError(f"{prefix}: float-quantized {kind}{bits}; supported: 8-bit float (e4m3)")
        w = reader.get(f"{prefix}.weight", dtype=torch.float8_e4m3fn)
        n, k = w.shape
        s = reader.get(f"{prefix}.weight_scale")
        gran = {"tensor": "tensor", "channel": "ch"}.get(strategy)
        if strategy == "block":
            bn, bk = (int(v) for v in wa["block_structure"])
            gran = f"b{bn}x{bk}"
        if gran is None:
            raise CheckpointError(f"{prefix}: float-quantized strategy {strategy!r}; supported: tensor, channel, block")
        s = s.reshape(1, 1) if gran == "tensor" else s.reshape(-1, 1) if gran == "ch" else s
        scheme = Scheme.parse(f"w8a{8 if act else 16}:e4m3:{gran}:{_sdt(s, prefix)}" + (f":{act}" if act else ""))
        return QuantizedWeight(scheme, (n, k), pack_bits(w.view(torch.uint8), 8), s.contiguous()), None
    if kind != "int":
        raise CheckpointError(f"{prefix}: {fmt} with {kind} weights is not supported; int weights only")
    offset = 1 << (bits - 1)
    if fmt == "pack-quantized":
        n, k = (int(v) for v in reader.get(f"{prefix}.weight_shape"))
        packed = reader.get(f"{prefix}.weight_packed", (n, (k * bits + 31) // 32), torch.int32)
        codes = unpack_bits(packed, bits, k)  # q + 2**(b-1)
    elif fmt == "naive-quantized":
        q = reader.get(f"{prefix}.weight", dtype=torch.int8)
        n, k = q.shape
        codes = (q.to(torch.int16) + offset).to(torch.uint8)
    else:
        raise CheckpointError(f"{prefix}: compressed-tensors format {fmt!r} is not supported; supported: {CT_FORMATS}")
    s = reader.get(f"{prefix}.weight_scale")
    if strategy == "channel":
        s, gran = s.reshape(n, 1), "ch"
    elif strategy == "group":
        gran = f"g{int(wa['group_size'])}"
    elif strategy == "tensor":
        s, gran = s.reshape(1, 1), "tensor"
    else:
        raise CheckpointError(f"{prefix}: int strategy {strategy!r}; supported: channel, group, tensor")
    perm = None
    if f"{prefix}.weight_g_idx" in reader:
        g = int(wa["group_size"])
        g_idx = reader.get(f"{prefix}.weight_g_idx", (k,)).long()
        if not torch.equal(g_idx, torch.arange(k) // g):
            perm = torch.argsort(g_idx, stable=True)
            codes = codes[:, perm]
    sdt = _sdt(s, prefix)
    tail = f":{act}" if act else ""
    a = 8 if act else 16
    if sym:
        scheme = Scheme.parse(f"w{bits}a{a}:int{bits}:{gran}:{sdt}{tail}")
        return QuantizedWeight(scheme, (n, k), pack_bits(codes.long() ^ offset, bits), s.contiguous()), perm
    groups = s.shape[1]
    if fmt == "pack-quantized":
        zp = reader.get(f"{prefix}.weight_zero_point", ((n * bits + 31) // 32, groups), torch.int32)
        zeros = unpack_bits(zp.t().contiguous(), bits, n).t().contiguous()  # zp + 2**(b-1)
    else:
        zp = reader.get(f"{prefix}.weight_zero_point", (n, groups), torch.int8)
        zeros = (zp.to(torch.int16) + offset).to(torch.uint8)
    scheme = Scheme.parse(f"w{bits}a{a}:uint{bits}:{gran}:{sdt}:zp-int{tail}")
    return QuantizedWeight(scheme, (n, k), pack_bits(codes, bits), s.contiguous(), zeros=zeros), perm


def _ct_fp4(reader, prefix: str, fmt: str, act: str) -> QuantizedWeight:
    """weight_packed uint8 [N, K/2] (low nibble first). NVFP4: weight_scale e4m3 [N, K/16] and
    weight_global_scale fp32 [1], which compressed-tensors *divides* by: we keep 1/global_scale as
    the second-level scale (what serving kernels multiply by; within one fp32 rounding of the
    library's s / global_scale). MXFP4: weight_scale ue8m0 codes [N, K/32], exact."""
    packed = reader.get(f"{prefix}.weight_packed", dtype=torch.uint8)
    n, k = packed.shape[0], packed.shape[1] * 2
    codes = pack_bits(_nibbles(packed), 4)
    a = f":{act}" if act else ""
    if fmt.startswith("mx"):
        s = reader.get(f"{prefix}.weight_scale", (n, k // 32), torch.uint8)
        return QuantizedWeight(Scheme.parse(f"w4a{8 if act else 16}:e2m1:g32:ue8m0{a}"), (n, k), codes, s.contiguous())
    s = reader.get(f"{prefix}.weight_scale", (n, k // 16), torch.float8_e4m3fn)
    gs = reader.get(f"{prefix}.weight_global_scale", dtype=torch.float32).reshape(())
    scheme = Scheme.parse(f"w4a{8 if act else 16}:e2m1:g16:e4m3:gs{a}")
    return QuantizedWeight(scheme, (n, k), codes, s.view(torch.uint8), global_scale=(1.0 / gs).float())


def _sdt(s: torch.Tensor, prefix: str) -> str:
    sdt = _SCALE_DTYPES.get(s.dtype)
    if sdt is None:
        raise CheckpointError(f"{prefix}.weight_scale is {s.dtype}; expected float16, bfloat16 or float32")
    return sdt


def _ct_act(args: dict | None, prefix: str) -> str:
    """compressed-tensors input_activations -> our activation token ('' when unquantized)."""
    if not args:
        return ""
    dtype = ("e4m3" if args.get("num_bits", 8) == 8 else None) if args.get("type") == "float" else "int8"
    strategy, dynamic = args.get("strategy", "tensor"), args.get("dynamic", False)
    if dtype is None:
        raise CheckpointError(f"{prefix}: input activations {args}; supported: 8-bit float or int8")
    if dynamic and strategy == "token":
        return f"{dtype}-token"
    if dynamic and strategy == "group":
        return f"{dtype}-g{int(args['group_size'])}"
    if not dynamic and strategy == "tensor":
        return f"{dtype}-static"
    raise CheckpointError(f"{prefix}: input activations {strategy} (dynamic={dynamic}) are not supported")
