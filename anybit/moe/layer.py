"""`QuantMoE`: expert-stacked quantized gate/up and down projections computing
y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])) with e = ids[t, j].

With the Triton backend usable (bf16/fp16 activations; A16 schemes, or per-token FP8 ones it runs
exactly) the two projections are one indexed grouped GEMM launch each over `moe_align`'s sorted rows
(up to `slot_max_rows` token x slot rows over the top-k ids as given, the top-k sum in the down GEMM: two launches)
— no host synchronisation, CUDA-graph capturable. Otherwise (backend="torch", static or per-group FP8
activations) every expert runs through `anybit.gemm` on its rows: the exact reference. Ids of -1
contribute nothing."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from anybit.backends.registry import gemm, prepare
from anybit.errors import AnybitError, FallbackWarning
from anybit.formats.scheme import Scheme
from anybit.kernels.gemm import OutOfResources, fewer_stages
from anybit.quant.weights import QuantizedWeight, quantize


class QuantMoE(nn.Module):
    def __init__(self, gate_up: QuantizedWeight, down: QuantizedWeight, backend: str = "auto"):
        super().__init__()
        if len(gate_up.shape) != 3 or len(down.shape) != 3:
            raise AnybitError(f"expert stacks must be (E, N, K): gate_up {gate_up.shape}, down {down.shape}")
        e, two_i, h = gate_up.shape
        if two_i % 2 or down.shape != (e, h, two_i // 2):
            raise AnybitError(
                f"gate_up {gate_up.shape} (gate rows, then up rows) and down {down.shape} must be "
                f"(E, 2I, H) and (E, H, I)"
            )
        self.num_experts, self.hidden, self.intermediate = e, h, two_i // 2
        self.gate_up, self.down, self.backend = gate_up, down, backend
        self._prepared: dict[int, tuple] = {}
        self._stacked = None
        self.split_k: int | None = None  # None: `moe_decode_plan` decides per call (GPU); 1 on the CPU
        self._plans: dict = {}  # (device, dtype, rows) -> grouped-path decisions: no re-deciding per call
        self._ws_failed = False  # the warp-specialised kernel failed once here: moe_gemm from then on
        self.check_ids = True  # expert ids >= E are an error, not skipped (GPU: a device assert; slot blocks: a trap)
        # calls of up to this many token x slot rows skip the alignment (`takes_slot_blocks`: a block per row, two
        # launches); more rows share more experts, whose weights a block per slot reads again
        self.slot_max_rows = slot_max_rows(e, (gate_up.nbytes + down.nbytes) / e)

    @classmethod
    def from_float(cls, gate_up: torch.Tensor, down: torch.Tensor, scheme: Scheme | str, backend="auto") -> QuantMoE:
        return cls(quantize(gate_up, scheme), quantize(down, scheme), backend)

    @classmethod
    def from_quantized(cls, gate_up: QuantizedWeight, down: QuantizedWeight) -> QuantMoE:
        return cls(gate_up, down)

    def _expert(self, e: int) -> tuple:
        if e not in self._prepared:
            self._prepared[e] = (
                prepare(self.gate_up.expert(e), self.backend),
                prepare(self.down.expert(e), self.backend),
            )
        return self._prepared[e]

    def _grouped_ok(self, x: torch.Tensor) -> bool:
        key = (x.device, x.dtype, "grouped")
        if key not in self._plans:
            self._plans[key] = self._decide_grouped(x)
        return self._plans[key]

    def _decide_grouped(self, x: torch.Tensor) -> bool:
        return grouped_why_not(self.gate_up.scheme, self.backend, x.device, x.dtype) is None

    def _grouped(self, x, topk_weights, topk_ids):
        from anybit.backends.triton import _triton_errors
        from anybit.backends.triton_layout import stack_experts
        from anybit.kernels.moe_gemm import moe_gemm, moe_sum, moe_tile_kind
        from anybit.kernels.moe_rs import moe_rs_layer, moe_rs_plan
        from anybit.kernels.moe_ws import moe_gemm_ws
        from anybit.kernels.moe_ws_a8 import moe_gemm_ws_a8
        from anybit.moe.align import moe_align

        if self._stacked is None or self._stacked[0].scales.device != x.device:
            self._plans = {k: v for k, v in self._plans.items() if k[-1] == "grouped"}  # workspaces are per device
            gate_up = self.gate_up.to(x.device)
            fused = gate_up.block[0] == 1  # rows can be interleaved when no scale spans several rows
            gate_up = interleave_gate_up(gate_up) if fused else gate_up
            self._stacked = (stack_experts(gate_up), stack_experts(self.down.to(x.device)), fused)
        gu, dn, fused = self._stacked
        t, k = topk_ids.shape
        rs_key = (x.device, x.dtype, t * k, "rs")
        if rs_key not in self._plans:
            self._plans[rs_key] = moe_rs_plan(gu, dn, t * k, self.num_experts, x.dtype, x.device)[0]
        if self._plans[rs_key]:  # the register-operand kernel: x in the sorted order, silu between the GEMMs
            block_m = self._plans[rs_key]
            sorted_ids, expert_ids, total = moe_align(topk_ids, self.num_experts, block_m, check=self.check_ids)
            y = moe_rs_layer(x, gu, dn, sorted_ids, expert_ids, total, topk_weights, block_m, fused)
            return moe_sum(y, topk_ids, self.num_experts)
        key = (x.device, x.dtype, t * k, self.split_k)
        if key not in self._plans:
            ws, ws_run = self._ws_plan(x, t * k)
            tiles = moe_tiles(t * k, self.num_experts, x.is_cuda, moe_tile_kind(gu, x.dtype))
            self._plans[key] = (
                (ws["block_m"], dict(ws, num_rows=t * k), dict(ws, num_rows=t * k), ws_run)
                if ws
                else (tiles["block_m"], self._launch(x, gu, t * k, tiles, fused),
                      self._launch(x, dn, t * k, down_tiles(tiles, moe_tile_kind(dn, x.dtype), dn.k), False), moe_gemm)
            )  # fmt: skip
        block_m, launch_gu, launch_dn, run = self._plans[key]
        slots = run is moe_gemm and takes_slot_blocks(t * k, block_m, self.slot_max_rows)
        if slots:  # the top-k ids as given, a block per flat slot (`moe_gemm(sorted_ids=None)`); ids >= E: a trap
            slot_key = (*key, "slots")
            if slot_key not in self._plans:
                self._plans[slot_key] = self._slot_plan(x, t * k, launch_gu, launch_dn)
            launch_gu, launch_dn = self._plans[slot_key]
            ids = topk_ids.reshape(-1)
            ids = ids if ids.is_contiguous() and ids.dtype in (torch.int32, torch.int64) else ids.int().contiguous()
            sorted_ids, expert_ids, total = None, ids, None
            checked = dict(check_ids=self.check_ids)
        else:  # ids >= E: an error, not skipped (GPU: a device-side assert; decode checks inside the alignment)
            sorted_ids, expert_ids, total = moe_align(topk_ids, self.num_experts, block_m, check=self.check_ids)
            checked = {}
        # gate_up with silu(gate) * up in its epilogue; down with each row times its top-k weight (slot blocks: and
        # each token's slots summed)
        xin = grouped_inputs(x, gu, launch_gu.get("pdl", False))
        try:
            act = _fitting(launch_gu, lambda **kw: run(tw=gu, sorted_ids=sorted_ids, expert_ids=expert_ids,
                                                        total=total, top_k=k, silu_mul=fused, out_dtype=x.dtype,
                                                        **checked, **xin, **kw))  # fmt: skip
        except _triton_errors() as e:
            if run not in (moe_gemm_ws, moe_gemm_ws_a8):
                raise
            self._ws_failed = True  # loud, and this layer keeps moe_gemm from now on
            self._plans.pop(key)
            warnings.warn(f"moe_ws kernel failed for {self.gate_up.scheme}, using moe_gemm: {type(e).__name__}: {e}",
                          FallbackWarning, stacklevel=3)  # fmt: skip
            return self._grouped(x, topk_weights, topk_ids)
        if not fused:
            act = _silu_mul(act, self.intermediate).to(x.dtype)
        # a row per token (slot blocks), or per flat slot for moe_sum (which skips dropped slots)
        y = torch.empty((t if slots else t * k, self.hidden), device=x.device, dtype=x.dtype)
        routed = topk_weights.reshape(-1).float().contiguous()
        sums = dict(checked, sum_slots=k) if slots else {}
        # quantized last, so that the quantizer is the kernel right before the down GEMM (PDL)
        ain = grouped_inputs(act, dn, launch_dn.get("pdl", False))
        _fitting(launch_dn, lambda **kw: run(tw=dn, sorted_ids=sorted_ids, expert_ids=expert_ids, total=total,
                                             top_k=1, out=y, routed_weights=routed, **sums, **ain, **kw))  # fmt: skip
        return y if slots else moe_sum(y, topk_ids, self.num_experts)

    def _slot_plan(self, x: torch.Tensor, rows: int, launch_gu: dict, launch_dn: dict) -> tuple[dict, dict]:
        """The plan's launches on slot blocks: one row a block (no half-width tails), and the down GEMM's workspace
        for its top-k sum."""
        one_row = [{name: v for name, v in launch.items() if name != "tail_half"} for launch in (launch_gu, launch_dn)]
        return one_row[0], self._workspace(x, self._stacked[1], rows, one_row[1], sums=True)

    def _ws_plan(self, x: torch.Tensor, rows: int) -> tuple:
        """(tile, run): the warp-specialised grouped kernel for both GEMMs of a call with `rows` token x slot rows —
        `moe_gemm_ws_a8` for W4A8 experts, `moe_gemm_ws` for A16 ones — and its tile, or (None, None): `moe_gemm`
        (`anybit.kernels.moe_ws_a8.moe_ws_a8_plan` / `anybit.kernels.moe_ws.moe_ws_plan` say why)."""
        from anybit.kernels.moe_ws import moe_gemm_ws, moe_ws_plan
        from anybit.kernels.moe_ws_a8 import moe_gemm_ws_a8, moe_ws_a8_plan

        if self._ws_failed:
            return None, None
        gu, dn, _ = self._stacked
        if gu.scheme.act.quantized:
            tile = moe_ws_a8_plan(gu, dn, rows, self.num_experts, x.device)[0]
            return (tile, moe_gemm_ws_a8) if tile else (None, None)
        tile = moe_ws_plan(gu, dn, rows, self.num_experts, x.dtype, x.device)[0]
        return (tile, moe_gemm_ws) if tile else (None, None)

    def _launch(self, x: torch.Tensor, tw, rows: int, tiles: dict, silu: bool) -> dict:
        """`launch_plan` and, where it splits K, the split workspace."""
        return self._workspace(x, tw, rows, launch_plan(tw, self.num_experts, rows, tiles, silu, x.device,
                                                        self.split_k))  # fmt: skip

    def _workspace(self, x: torch.Tensor, tw, rows: int, plan: dict, sums: bool = False) -> dict:
        """The launch `plan` with the split workspace where it splits K or sums each token's slots (`sums`: slot
        blocks' down GEMM; its blocks are the rows themselves)."""
        from anybit.backends.registry import get_backend
        from anybit.kernels.dequant import cdiv

        split = plan["split_k"]
        if split == 1 and not sums:
            return plan
        grid_m = max(rows, cdiv(rows, plan["block_m"]) + min(self.num_experts, rows))
        floats = split * grid_m * plan["block_m"] * tw.n
        ws, cnt = get_backend("triton").workspace(x.device, floats, grid_m * cdiv(tw.n, plan["block_n"]))
        return dict(plan, workspace=ws, counters=cnt)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if (
            x.dim() != 2
            or x.shape[1] != self.hidden
            or topk_ids.shape != topk_weights.shape
            or topk_ids.shape[0] != x.shape[0]
        ):
            raise AnybitError(
                f"x {tuple(x.shape)} must be [T, {self.hidden}] with topk_weights/topk_ids "
                f"{tuple(topk_weights.shape)}/{tuple(topk_ids.shape)} of shape [T, k]"
            )
        if self._grouped_ok(x):
            return self._grouped(x, topk_weights, topk_ids)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        ids = topk_ids.long()
        for e in torch.unique(ids[ids >= 0]).tolist():
            if e >= self.num_experts:
                raise AnybitError(f"expert id {e} out of range for {self.num_experts} experts")
            tok, slot = (ids == e).nonzero(as_tuple=True)
            gu, dn = self._expert(e)
            hidden = gemm(x[tok], gu)
            y = gemm(_silu_mul(hidden, self.intermediate).to(x.dtype), dn).float()
            out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
        return out.to(x.dtype)


# Token x slot rows up to which `QuantMoE` runs its GEMMs on the top-k ids as given (slot blocks: no alignment, the
# top-k sum in the down GEMM; two launches instead of five). One token's top-k experts differ, so each expert's weights
# are read once as with the alignment; a few tokens share some experts, read again, which the three launches saved
# outweigh while the experts are small or the tokens few. H200 graphs, layer µs aligned -> slot blocks (session 44):
# M=1 Qwen3-30B-A3B w4a16 22.5 -> 15.1, W4A8 25.8 -> 19.2, W8A8 29.4 -> 23.6, NVFP4 24.1 -> 17.2; DeepSeek-V3 w4a16
# 71.3 -> 64.1, W4A8 69.3 -> 69.8, W8A8 106.2 -> 110.1, NVFP4 83.5 -> 74.9; M=4 Qwen3 w4a16 42.3 -> 32.6, NVFP4 50.2 ->
# 39.0, W8A8 55.3 -> 52.2, DeepSeek-V3 w4a16 213.4 -> 199.8, W8A8 321.7 -> 319.6; M=16 slower everywhere (Qwen3 w4a16
# 86.1 -> 95.4, DeepSeek 690 -> 821). Session 45, 6 / 8 / 10 tokens: Qwen3-30B-A3B (2.4-4.7 MB an expert) faster in
# all 10 cells up to 8 (w4a16 48.4 / 59.0 -> 46.7 / 52.9, W4A8 60.4 -> 53.7 at 8, NVFP4 64.8 -> 64.5), at 10 in 4 of 5
# (NVFP4 78.6 -> 80.1); DeepSeek-V3 (22-44 MB) even under FP8 x and 4-7 % slower in the 4-bit A16 formats from 6
# (w4a16 292.3 -> 304.1, NVFP4 465.6 -> 499.6 at 8). So 32 rows (4 tokens of top-8), 64 for experts up to
# SLOT_SMALL_EXPERT_BYTES — at most half the experts either way (few experts: most rows would share one; not measured).
SLOT_MAX_ROWS = 32
SLOT_MAX_ROWS_SMALL = 64
SLOT_SMALL_EXPERT_BYTES = 8 << 20


def slot_max_rows(experts: int, expert_bytes: float) -> int:
    """Token x slot rows up to which a layer of `experts` experts of `expert_bytes` (gate_up and down weights with
    their scales) runs on slot blocks (`takes_slot_blocks`)."""
    most = SLOT_MAX_ROWS_SMALL if expert_bytes <= SLOT_SMALL_EXPERT_BYTES else SLOT_MAX_ROWS
    return min(most, experts // 2)


def takes_slot_blocks(rows: int, block_m: int, most: int) -> bool:
    """Whether `QuantMoE`'s grouped GEMMs (`moe_gemm`) run a call of `rows` token x slot rows on slot blocks: up to
    `most` (`slot_max_rows`), where the plan's blocks are a power of two (blocks of two parts are prefill tiles)."""
    from anybit.kernels.moe_gemm import two_part_block

    return rows <= most and not two_part_block(block_m)


def grouped_why_not(scheme: Scheme, backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """None when `QuantMoE` runs these experts as grouped Triton GEMMs, else why the per-expert loop runs."""
    from anybit.backends.base import Problem
    from anybit.backends.triton import TritonBackend, fp8_unsupported
    from anybit.backends.triton_layout import fp8_as_is
    from anybit.formats.scheme import ActMode

    act = scheme.act
    if backend not in ("auto", "triton"):
        return f"backend={backend!r}: the per-expert loop on that backend"
    # static scales differ per expert: the exact loop runs; x scaled per 128-K group needs FP8 experts
    # read as stored (FP8-block), whose K tiles lie in one group
    group_ok = act.mode is ActMode.GROUP and act.group % 128 == 0 and fp8_as_is(scheme)
    if act.quantized and not (act.mode is ActMode.TOKEN or group_ok):
        return f"{act.token()} activations: the grouped GEMMs take per-token scales (or FP8-block's 128-column groups)"
    why = fp8_unsupported(scheme) if act.quantized else None
    if why:
        return why
    ok, why = TritonBackend().supports(Problem(scheme, 0, 0, None, device, dtype))
    return None if ok else why


def launch_plan(tw, experts: int, rows: int, tiles: dict, silu: bool, device: torch.device,
                split_k: int | None = None) -> dict:  # fmt: skip
    """A grouped GEMM's launch keywords but the split workspace: the tile it runs (`moe_block_n`), PDL where
    it launches right after its quantizer, and on a GPU split-K where the launch would leave SMs idle
    (decode: `moe_decode_plan`; split_k forces one) — else half-width tail blocks from 32 rows on (H200:
    w4a16, 32-128 row blocks, 2-9 % faster, e.g. DeepSeek-V3 M=4096 gate_up 4845 -> 4622 µs, down 2868 ->
    2654; Qwen3 M=1024 191 -> 176; 16-row decode blocks lose 15-19 % by it)."""
    from anybit.backends.triton import _sm_count, pdl_launch
    from anybit.kernels.moe_gemm import moe_block_n, moe_decode_plan, two_part_block

    tiles = dict(tiles, block_n=moe_block_n(tw, tiles["block_n"], tiles["num_warps"]))  # the tile it runs
    if tw.frag and pdl_launch(device):
        tiles["pdl"] = True
    split = split_k or 1
    two = two_part_block(tiles["block_m"])  # blocks of two parts: no split-K, no half-width tails
    if split_k is None and device.type == "cuda" and not two:
        narrow = tw.frag and not silu and tw.fmt["W_BITS"] != 2
        as_stored = tw.nk and not tw.scheme.act.group  # FP8 experts read as stored, x per token: no split
        tiles["block_n"], split, maxnreg = moe_decode_plan(rows, experts, tw.n, tw.k, tiles, _sm_count(device),
                                                           tw.frag, narrow, split_ok=not as_stored)  # fmt: skip
        if maxnreg:
            tiles["maxnreg"] = maxnreg
    if split == 1 and tiles["block_m"] >= 32 and not two:
        tiles["tail_half"] = True
    return dict(tiles, num_rows=rows, split_k=split)


def _fitting(launch: dict, run):
    """run(**launch); a launch that asks more shared memory per block than this GPU has (sm_86/89: 99 KB)
    retries one pipeline stage shallower, and the layer's plan keeps the stage count that fits."""
    while True:
        try:
            return run(**launch)
        except OutOfResources as e:
            launch.update(fewer_stages(e, launch))


# Rows of x up to which the quantizer triggers its grouped GEMM's early launch (PDL). The dense route stops at 4 rows
# (`anybit.backends.triton.QUANT_EARLY_MAX_M`: at 16 the early GEMM's CTAs crowded the SMs the quantizer left free);
# here every size still triggers: limited to 4 rows it measured even (H200, W4A8 / W8A8 decode layers, BENCHMARKS.md
# session 17; tools/moe_bench.py --quant-early-max-rows).
QUANT_EARLY_MAX_ROWS = 1 << 30


def grouped_inputs(x: torch.Tensor, tw, pdl: bool = False) -> dict:
    """The grouped GEMM's input for the stacked experts `tw`: x itself, or (FP8-activation schemes) x quantized per
    row (or per row and group: `x_group`) with its scales (and, for integer frag-layout experts, its per-128-K-block
    sums; `codes_a16` experts: the codes in x's dtype), as `moe_gemm` keywords. pdl: the GEMM launches as a
    programmatic dependent of the quantizer (its launch plan's `pdl`)."""
    scheme = tw.scheme
    if not scheme.act.quantized:
        return dict(x=x)
    pdl = pdl and x.shape[0] <= QUANT_EARLY_MAX_ROWS
    from anybit.formats.scheme import ActMode
    from anybit.kernels.quant_act import quantize_act

    if tw.codes_a16:  # the A16 kernels on x's FP8 codes in x's dtype, its scales in their epilogue
        xq, xs = quantize_act(x.contiguous(), scheme.act, pdl=pdl, codes_dtype=x.dtype)
        return dict(x=xq, x_scales=xs)
    xq, xs, *sums = quantize_act(x.contiguous(), scheme.act, block_sums=tw.takes_sums, pdl=pdl)
    group = scheme.act.group if scheme.act.mode is ActMode.GROUP else 0
    return dict(x=xq, x_scales=xs, x_group=group, x_sums=sums[0] if sums else None)


def block_stats(tokens: int, top_k: int, experts: int, block_m: int, short: int = 0) -> dict:
    """What `block_m`-row blocks cost a layer whose tokens pick top_k of `experts` uniformly (each expert's rows
    ~ Binomial(tokens, top_k / experts)): the mean rows an expert, the blocks an expert (each reads and decodes the
    expert's weights), the share of experts that spill past one block, and the share of the MMA's rows that are
    padding — why `moe_tiles` picks the block it does (`anybit explain --moe`). short: the rows an expert's last
    block runs when it holds no more (a block of two parts: its first; `tail_half`: half), else whole blocks."""
    p = min(1.0, top_k / experts)
    mean = tokens * p
    n = torch.arange(tokens + 1, dtype=torch.float64)
    if p >= 1.0:  # every token picks every expert
        pmf = (n == tokens).double()
    else:
        pmf = torch.distributions.Binomial(tokens, probs=torch.tensor(p, dtype=torch.float64)).log_prob(n).exp()
    full = torch.ceil(n / block_m)
    blocks = float((pmf * full).sum())
    spill = float(pmf[n > block_m].sum())
    last = n - (full - 1) * block_m  # rows of an expert's last block (0 < last <= block_m where it has rows)
    width = torch.where((last <= short) & (n > 0), short, block_m) if short else torch.full_like(n, block_m)
    launched = float((pmf * ((full - 1).clamp(min=0) * block_m + torch.where(n > 0, width, 0))).sum())
    return dict(mean=mean, blocks=blocks, spill=spill, padding=1.0 - mean / launched if launched else 0.0)


# Rows an expert above which the "wide" and "a8" kinds' decode tile takes 32-row blocks (at 12, ~10 % of the experts
# hold more than 16 rows). H200 graphs, session 42, Qwen3-30B-A3B M=256 (16.0 rows an expert), gate_up / down µs,
# 16 -> 32-row blocks: w4a16 85.6 / 56.3 -> 82.9 / 52.0, NVFP4 111.1 / 61.9 -> 93.0 / 50.1, W4A8 75.3 / 47.8 -> 68.1 /
# 45.6 (Humming 82.9 / 48.3, 104.2 / 59.1, 67.4 / 49.0); 64- and 128-row blocks were slower there and at M=1024.
SPILL_16_ROWS = 12


# "wide" experts' blocks above 16 rows an expert: (most rows an expert, block rows), blocks of two parts (48 = 32 +
# 16, 80 = 64 + 16, 144 = 128 + 16: `moe_gemm.two_part_why_not`) sized so that most experts fit one block, whose
# second part runs only where the expert reaches it — instead of power-of-two blocks with ~half the experts spilling
# into a second block that reads and decodes their weights again. H200 graphs, session 43, gate_up / down µs (power of
# two -> two parts; Humming in brackets): DeepSeek-V3 M=1024 (32 rows an expert) w4a16 1877 / 1070 -> 1776 / 1015
# (1635 / 832), NVFP4 2018 / 1176 -> 1993 / 1143 (1981 / 1036); Qwen3-30B-A3B M=1024 (64) w4a16 173 / 111 -> 142 / 90
# (142 / 83), NVFP4 181 / 114 -> 157 / 95 (154 / 94); DeepSeek-V3 M=4096 (128) w4a16 4842 / 2753 -> 4280 / 2533 (4435
# / 2261), NVFP4 4955 / 2839 -> 4418 / 2626 (5154 / 2719). At 256 rows an expert (Qwen3-30B-A3B M=4096) 144-row
# blocks were even (gate_up 3-5 % faster, down 3-4 % slower): 128 stays. The limits between are not measured.
WIDE_BLOCKS = ((36, 48), (96, 80), (192, 144), (float("inf"), 128))

# "a8-acc" experts (e2m1 on the FP8 MMA accumulating the whole K) from this many rows an expert up to 96: 80-row blocks
# of two parts. H200 graphs, session 43, W4A8-MXFP4 gate_up / down µs, 64 -> 80: Qwen3-30B-A3B M=1024 (64 rows an
# expert) 127.8 / 86.3 -> 104.4 / 73.0; at 32 rows (DeepSeek-V3 M=1024) 48- and 80-row blocks were even or slower
# (1403 / 830 -> 1485 / 766 and 1504 / 866), so 64 stays there. W4A8's integer experts with fresh products per block
# ("a8") keep 64: the product spills at 80 rows (sm_90a 120 bytes) and 48-row blocks ran slower (Qwen3 M=1024 130 / 86
# -> 159 / 110); rescaled in the MMA ("a8-rescale", `frag.frag_rescale`) they take 80 (117 / 83 µs).
A8_ACC_TWO_MIN_ROWS = 36


def moe_tiles(rows: int, experts: int, cuda: bool, kind: str = "") -> dict:
    """Grouped-GEMM tile by the average rows per expert: 16-row blocks with deep K tiles when experts
    see a token or two (decode: bandwidth), 32/64/128-row blocks when they see many (prefill: MMA).
    kind (`moe_tile_kind`; H200 numbers, DeepSeek-V3 gate_up / down, tools/moe_bench.py):
    "wide": from 17 rows per expert blocks of two parts by `WIDE_BLOCKS` (48, 80, 144; 64-row blocks before: M=1024
    w4a16 2175 -> 1977 µs, 1245 -> 1172); blocks of 128 rows and more take 256 weight rows per CTA (x read half as
    often).
    "a8" (fragment-layout experts under FP8 x): 64-row blocks from 17 rows per expert on (w4a8 M=1024
    1695 -> 1515 µs, 993 -> 881; M=4096 4437 -> 4288, 2977 -> 2569).
    "a8-rescale" (W4A8's integer experts accumulating in the FP8 MMA, `frag.frag_rescale`): as "a8", from
    `A8_ACC_TWO_MIN_ROWS` to 96 rows an expert 80-row blocks of two parts, above blocks of 128 weight rows on 4 warps
    of 144 = 128 + 16 rows up to 192 rows an expert, 128 above (session 48, M=4096 gate_up / down: DeepSeek-V3, 128
    rows an expert, 3478 / 2128 µs on "a8-acc"'s 128 x 256 tiles -> 3470 / 1936 on 128 x 128 -> 3235 / 1845 with 144
    rows; Qwen3-30B-A3B, 256 an expert, 379 / 275 -> 346 / 223, 144 rows even; 64 x 256 on 8 warps 4162 / 2549).
    "a8-acc" (e2m1 experts on the FP8 MMA accumulating the whole K): as "a8", from `A8_ACC_TWO_MIN_ROWS` to 96 rows
    an expert 80-row blocks of two parts (Qwen3-30B-A3B M=1024 128 / 86 -> 104 / 73 µs), above 96 128-row
    blocks of 256 weight rows (one accumulator: 8 warps fit; M=4096 gate_up / down 3719 -> 3154 µs, 2366 -> 1923,
    Qwen3-30B-A3B 395 -> 336, 272 -> 236; at 32-64 rows per expert 64-row blocks stay faster, 1388 vs 1564).
    "fp8" / "fp8-block" (FP8 experts read as stored, x per token / per 128 columns): 128-deep K tiles
    (W8A8 M=1024 3862 -> 1952 µs; M=4096 3990 -> 3056 with 128 x 256 tiles; FP8-block keeps 64-row
    blocks, its per-tile promotion spills 128-row ones: 7527 -> 4958); W8A8 decode 256-deep (M=1
    71.5 -> 66.7 µs, M=16 714 -> 672, M=256 1853 -> 1721; FP8-block's K tile must lie in an x group)."""
    if not cuda:
        return dict(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2)
    per_expert = rows / experts
    if per_expert <= 16:
        if kind == "fp8":
            return dict(block_m=16, block_n=128, block_k=256, num_warps=4, num_stages=3)
        # Near 16 rows an expert, ~40 % of the experts would spill into a second 16-row block, which reads and
        # decodes the expert's weights again: 32-row blocks (their 16-row halves run half-width) read them once.
        rows_m = 32 if per_expert > SPILL_16_ROWS and kind in ("wide", "a8", "a8-acc", "a8-rescale") else 16
        return dict(block_m=rows_m, block_n=128, block_k=128, num_warps=4, num_stages=4)
    if kind.startswith("fp8"):
        if per_expert <= 96:
            return dict(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4)
        return dict(block_m=128 if kind == "fp8" else 64, block_n=256, block_k=128, num_warps=8, num_stages=3)
    if kind == "wide":
        block_m = next(b for most, b in WIDE_BLOCKS if per_expert <= most)
        if block_m < 128:
            return dict(block_m=block_m, block_n=128, block_k=64, num_warps=4, num_stages=4)
        return dict(block_m=block_m, block_n=256, block_k=64, num_warps=8, num_stages=3)
    if per_expert <= 48 and not kind.startswith("a8"):
        return dict(block_m=32, block_n=128, block_k=64, num_warps=4, num_stages=4)
    if kind == "a8-acc" and per_expert > 96:
        return dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
    if kind == "a8-rescale" and per_expert > 96:
        return dict(block_m=144 if per_expert <= 192 else 128, block_n=128, block_k=64, num_warps=4, num_stages=3)
    if kind in ("a8-acc", "a8-rescale") and per_expert > A8_ACC_TWO_MIN_ROWS:
        return dict(block_m=80, block_n=128, block_k=64, num_warps=4, num_stages=4)
    if per_expert <= 96 or kind.startswith("a8"):
        return dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
    return dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)


# The down GEMM's K (the expert's intermediate size) from which its 64-row blocks take 256 weight rows.
DOWN_WIDE_MIN_K = 2048


def down_tiles(tiles: dict, kind: str, k: int) -> dict:
    """The down GEMM's tile from the layer's (`moe_tiles`): 64-row blocks of "wide" experts with K >= DOWN_WIDE_MIN_K
    take 256 weight rows (8 warps), as their 128-row blocks do (H200 graphs, session 31, DeepSeek-V3 w4a16 M=1024, 32
    rows an expert, K=2048: down 1117.1 -> 1074.0 µs, Humming 876.2; gate_up, whose silu·up epilogue holds two tiles,
    1906.5 -> 1920.1: keeps 128). Short K keeps 128 (session 32, Qwen3-30B-A3B M=1024, K=768: w4a16 110.9 -> 118.5,
    nvfp4 112.2 -> 128.5: twelve 64-K steps do not cover the 8-warp tile's pipeline fill)."""
    if kind == "wide" and k >= DOWN_WIDE_MIN_K and tiles["block_m"] in (48, 64) and tiles["block_n"] == 128:
        return dict(tiles, block_n=256, num_warps=8)
    return tiles


def interleave_gate_up(qw: QuantizedWeight) -> QuantizedWeight:
    """(E, 2I, H) gate rows then up rows -> rows 2j = gate j, 2j+1 = up j, so every N tile of the
    grouped GEMM holds matching gate and up columns (its epilogue computes silu(gate) * up). Needs one
    scale row per weight row (channel or group scales, not 2-D blocks)."""
    if qw.block[0] != 1:
        raise AnybitError(f"cannot interleave gate/up rows of {qw.scheme}: its scales span {qw.block[0]} rows")
    i = qw.n // 2
    perm = torch.stack([torch.arange(i), torch.arange(i, 2 * i)], dim=1).reshape(-1).to(qw.device)
    rows = {name: t.index_select(-2, perm) for name, t in qw.tensors().items() if name != "global_scale"}
    return QuantizedWeight(qw.scheme, qw.shape, global_scale=qw.global_scale, **rows)


def _silu_mul(h: torch.Tensor, i: int) -> torch.Tensor:
    """silu(gate) * up in fp32 for h = [gate | up] (the first i columns are the gate)."""
    return torch.nn.functional.silu(h[:, :i].float()) * h[:, i:].float()
