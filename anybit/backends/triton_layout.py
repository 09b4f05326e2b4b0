"""The Triton backend's prepared weight: bit planes packed along K, N contiguous (see
`anybit.kernels.dequant` for where every bit lives), scales and zeros transposed to [K groups, N].
FP8 weights paired with FP8 activations of the same encoding stay as they are, [N, K] with K
contiguous: the tensor cores read them without decoding, K-major as FP8 wgmma wants. 4-bit weights
(integer or e2m1) with bf16/fp16 activations use the MMA-fragment layout of `anybit.kernels.frag`
instead."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from anybit import settings
from anybit.backends.blockscaled import ROW_SPREAD_MAX, blockscaled_recipe, cublas_weight_scales, e2m1_row_scales
from anybit.formats.dtypes import FloatType, IntType, torch_float8
from anybit.formats.scheme import ActMode, ActSpec, ScaleKind, Scheme, ZeroPoint
from anybit.kernels.frag_decode import E2M1_A8_SHIFT, E2M1_A8_SPREAD_MAX, RESCALE_SPREAD
from anybit.kernels.frag_layout import pack_frag, pack_frag3
from anybit.quant.weights import QuantizedWeight

# every width is a sum of planes whose widths divide 32, lowest bits first
PLANES = {1: (1,), 2: (2,), 3: (2, 1), 4: (4,), 5: (4, 1), 6: (4, 2), 7: (4, 2, 1), 8: (8,)}
K_ALIGN = 32  # K is padded to this so every plane's rows are whole words


@dataclass
class TritonWeight:
    """A QuantizedWeight in the Triton kernels' layout (2-D: one dense layer)."""

    scheme: Scheme
    n: int
    k: int
    planes: list[torch.Tensor]  # int32 [K_pad*w/32, N] per plane
    plane_bits: tuple[int, ...]
    scales: torch.Tensor  # [K/group_k, ceil(N/group_n)], storage dtype of the scheme (`e2m1_a8`: row-relative codes)
    zeros: torch.Tensor | None  # same layout as scales
    global_scale: torch.Tensor | None  # fp32 [1]
    group_k: int
    group_n: int
    fmt: dict  # weight_format_constexprs(scheme), computed once here rather than per call
    nk: bool = False  # planes[0] is the weight itself, [N, K] in the activations' FP8 dtype
    frag: bool = False  # planes[0] is int32 [N, K_pad/8] in the MMA fragment order (`anybit.kernels.frag`)
    codes_a16: bool = False  # FP8 activations on the A16 frag kernels, their codes in x's dtype (`codes_a16`)
    a16: Scheme | None = None  # int4 W4A8 as codes (`int4_codes_scheme`): the A16 scheme its kernels' choices read
    unit_scales: torch.Tensor | None = None  # ... and scales of ones: its e4m3 codes for the block-scaled GEMM
    input_scale: torch.Tensor | None = None  # fp32 []: static activation scale (e4m3-static schemes)
    fold: frozenset = frozenset()  # x dtypes whose frag e2m1 decode takes the rebias from the scales (`frag_fold`)
    fold_bits: bool = False  # ... and whose scales may be built from their bits there (`scale_bits_exact`)
    blockscaled: str | None = None  # "1x128"/"128x128": large M runs cuBLAS's block-scaled FP8 GEMM (`blockscaled`)
    blockscaled_scales: torch.Tensor | None = None  # fp32 weight scales in cuBLAS's layout (`cublas_weight_scales`)
    rowwise: tuple | None = None  # MXFP4 under FP8 x as e4m3 times a power of two a row (`e2m1_row_scales`)
    rescale: bool = False  # integer codes under FP8 x whose group scales allow a rescaled accumulator (`rescalable`)
    configs: dict = field(default_factory=dict)  # M -> tile picked for this weight on its device
    ws_ok: dict = field(default_factory=dict)  # x dtype (A16) -> whether (the warp-specialised, the register-operand
    # kernel, only the former's row-major tiles: `frag_rs.ws_int_why_not`) run it ((False, False, False): one failed);
    # "a8" -> whether the W4A8 kernel does; ("mid", x dtype) -> the weight's `frag_mid_kind` (which 65-256-row calls
    # take the frag kernel); ("tile", M, x dtype) -> the tile of an M-row call (`ws_route_tile`, or None)
    ws_desc: dict = field(default_factory=dict)  # N tile -> TMA descriptors of words, scales (`weight_descs`); ("int",
    # x dtype, N tile) -> the integer Gluon kernels' ones, zero points too (`frag_ws.int_descs`)
    launches: dict = field(default_factory=dict)  # a frag launch's tile and flags -> its constexprs (`gemm_frag`)

    @property
    def device(self) -> torch.device:
        return self.scales.device

    @property
    def kernel_scheme(self) -> Scheme:
        """The scheme the kernels' choices (tiles, routes, tuning keys) read: the weight's, or for int4 W4A8 weights
        laid out as codes their A16 twin (`a16_twin`)."""
        return self.a16 or self.scheme

    @property
    def mma_a8(self) -> bool:
        """The kernels run it on the FP8 MMA (FP8 activations, not `codes_a16`): x comes as e4m3."""
        return self.scheme.act.quantized and not self.codes_a16

    @property
    def e2m1_a8(self) -> bool:
        """MXFP4 on the FP8 MMA: e2m1 codes packed in the FP8 order (`frag_layout.e2m1_a8_bit_order`), decoded to
        e4m3 by look-up tables of their groups' exponents relative to the row (`rowwise`: those codes, and the
        rows' powers of two times 2**-E2M1_A8_SHIFT, applied after the K loop)."""
        return self.frag and self.mma_a8 and bool(self.fmt["W_FLOAT"])

    @property
    def takes_sums(self) -> bool:
        """The frag kernels subtract the codes' offset times x's per-128-K-block sums (integer codes on the FP8 MMA):
        the quantizer writes them (`quantize_act(block_sums=True)`)."""
        return self.frag and self.mma_a8 and not self.e2m1_a8

    @property
    def x_wants(self) -> str:
        """The activations the kernels take for this weight, for error messages."""
        return "e4m3" if self.mma_a8 else ("FP8 codes in bf16/fp16" if self.codes_a16 else "bf16/fp16")

    @property
    def nbytes(self) -> int:
        ts = [*self.planes, self.scales] + [t for t in (self.zeros, self.global_scale) if t is not None]
        bs = self.blockscaled_scales
        if bs is not None and bs.untyped_storage().data_ptr() != self.scales.untyped_storage().data_ptr():
            ts.append(bs)  # an fp32 copy (bf16/fp16 scales, or padded 128x128 blocks)
        # row-relative scale codes (for `e2m1_a8` weights the scales themselves) and row scales (`e2m1_row_scales`)
        ts += [t for t in self.rowwise or () if t.data_ptr() != self.scales.data_ptr()]
        return sum(t.numel() * t.element_size() for t in ts)


def pack_planes(codes: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """uint8 codes [N, K] -> one int32 [K_pad*w/32, N] tensor per plane width w of PLANES[bits]."""
    n, k = codes.shape
    c = codes.to(torch.int64)
    pad = -k % K_ALIGN
    if pad:
        c = torch.cat([c, c.new_zeros(n, pad)], dim=1)
    out, low = [], 0
    for w in PLANES[bits]:
        per_word = 32 // w
        plane = ((c >> low) & ((1 << w) - 1)).reshape(n, -1, per_word)
        shifts = torch.arange(per_word, device=c.device) * w
        words = (plane << shifts).sum(dim=-1)
        words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
        out.append(words.t().contiguous())
        low += w
    return out


def stored_codes(qw: QuantizedWeight) -> torch.Tensor:
    """The codes as the kernels read them: signed integers biased by 2**(b-1) (sign bit flipped), so
    decoding never needs the flip and the decode GEMV's magic-number trick sees unsigned codes."""
    codes = qw.codes()
    w = qw.scheme.weight
    if isinstance(w, IntType) and w.signed:
        codes = codes ^ (1 << (w.bits - 1))
    return codes


def fp8_as_is(scheme: Scheme) -> bool:
    """The weight's codes are the FP8 activations' own encoding: the GEMM reads them as they are."""
    w, act = scheme.weight, scheme.act
    if not (act.quantized and isinstance(w, FloatType) and isinstance(act.dtype, FloatType)):
        return False
    return torch_float8(w) is not None and torch_float8(w) == torch_float8(act.dtype)


def codes_a16(scheme: Scheme) -> bool:
    """FP8-activation schemes whose weights run on the A16 frag kernels: e2m1 weights with scales every 16, 32
    or 64 along K (NVFP4, MXFP4) and x quantized per token or statically to e4m3/e5m2. The FP8 MMA would
    promote its partial sums every 32 K or fewer (one k32 instruction each: H200 8192² M=1 82 µs against
    17.5 for the A16 kernel); instead x's FP8 codes travel in x's dtype (exact: bf16 and fp16 hold every
    e4m3/e5m2 value), the bf16/fp16 MMA multiplies them with the decoded weights (products exact in its fp32
    sums, as in the FP8 MMA), and x's scales multiply the sums in the epilogue. (MXFP4 under e4m3 x per token whose
    rows allow it runs on the FP8 MMA instead, with one scale a row: `TritonWeight.e2m1_a8`.)"""
    act, w, g = scheme.act, scheme.weight, scheme.granularity
    if not (act.quantized and act.mode in (ActMode.TOKEN, ActMode.STATIC) and act.dtype.name in ("e4m3", "e5m2")):
        return False
    e2m1 = isinstance(w, FloatType) and (w.exp, w.man) == (2, 1) and scheme.zero_point is ZeroPoint.NONE
    return e2m1 and g.kind is ScaleKind.GROUP and g.k in (16, 32, 64)


INT4_CODES_MAX_N = 8192  # from this N on int4 W4A8 keeps the FP8 MMA (its warp-specialised kernel, `frag_ws_a8`)


def int4_codes_scheme(scheme: Scheme) -> bool:
    """int4 W4A8 schemes whose weights (N < INT4_CODES_MAX_N, ANYBIT_W4A8_CODES=1) may run as `codes_a16`: signed
    4-bit integers without zero point or global scale, scales per channel or per whole 128-K blocks, e4m3 x per token.
    The A16 kernels multiply the decoded weight by its scale in x's dtype: the scales are rounded to bf16 once (a
    relative 2**-9, against the 2**-4 of e4m3 x)."""
    act, w, g = scheme.act, scheme.weight, scheme.granularity
    if not (a8_mma(scheme) and frag_format(scheme) and isinstance(w, IntType) and w.bits == 4 and w.signed):
        return False
    if scheme.zero_point is not ZeroPoint.NONE or scheme.global_scale:
        return False
    per_token = act.mode is ActMode.TOKEN and act.dtype.name == "e4m3"
    return per_token and (g.kind is ScaleKind.CHANNEL or (g.kind is ScaleKind.GROUP and g.k % 128 == 0))


def a16_twin(scheme: Scheme) -> Scheme:
    """The A16 scheme of an `int4_codes_scheme` weight's kernels: the same codes and scale layout, bf16 scales, no
    activation quantization."""
    return dataclasses.replace(scheme, scale_dtype=Scheme.parse("w4a16").scale_dtype, act=ActSpec())


def e2m1_rows_scheme(scheme: Scheme) -> bool:
    """MXFP4 under e4m3 x per token: `codes_a16` with ue8m0 scales — the schemes whose weights, where their rows'
    scales lie within 11 binades (`e2m1_row_scales`, checked when prepared), run on the FP8 MMA by look-up tables
    (`TritonWeight.e2m1_a8`) and above ROWWISE_MIN_M rows as e4m3 through cuBLAS's row-wise FP8 GEMM."""
    act = scheme.act
    per_token_e4m3 = act.mode is ActMode.TOKEN and act.dtype.name == "e4m3"
    return codes_a16(scheme) and scheme.scale_dtype.name == "ue8m0" and per_token_e4m3


def a8_mma(scheme: Scheme) -> bool:
    """Whether the Triton kernels run this scheme on the FP8 MMA (FP8 activations not `codes_a16`)."""
    return scheme.act.quantized and not codes_a16(scheme)


def frag_format(scheme: Scheme) -> bool:
    """Weights that get the fragment layout (`anybit.kernels.frag`), whose kernels decode two weights
    per instruction straight into the tensor cores' registers: bf16/fp16 activations with 2-, 4- or
    8-bit integer weights (no or an integer zero point) with scales per channel, per tensor or per whole
    K blocks (2-bit: also per 64 along K; 8-bit: per 64), or e2m1 weights without zero point and
    scales per channel/tensor, per 16/32/64 along K or per whole 128-K blocks (NVFP4, MXFP4). With
    also 4-bit integer weights with e4m3 activations quantized per token and whole-block scales (W4A8,
    H200 M <= 64: 2.2-2.8x the bit-plane A8 kernel; above, g128 weights go to cuBLAS's block-scaled GEMM), and the
    `codes_a16` schemes in the A16 order."""
    w, g, act = scheme.weight, scheme.granularity, scheme.act
    if w.bits not in (2, 4, 8) or scheme.zero_point is ZeroPoint.FLOAT:
        return False
    if codes_a16(scheme):
        return True
    whole_blocks = g.kind in (ScaleKind.CHANNEL, ScaleKind.TENSOR) or g.k % 128 == 0
    if w.bits in (2, 8):  # 256-K / 64-K blocks, groups of 64 and whole 128s handled per quarter / block
        return isinstance(w, IntType) and not act.quantized and (whole_blocks or g.k == 64)
    if act.quantized:
        token_e4m3 = act.mode is ActMode.TOKEN and act.dtype.name == "e4m3"
        return isinstance(w, IntType) and token_e4m3 and whole_blocks
    if isinstance(w, FloatType):
        if not ((w.exp, w.man) == (2, 1) and scheme.zero_point is ZeroPoint.NONE):
            return False
        return whole_blocks or g.k in (16, 32, 64)
    return isinstance(w, IntType) and whole_blocks


def frag3_format(scheme: Scheme) -> bool:
    """3-bit integer weights that get the fragment layout's 3-bit planes (`frag_layout.pack_frag3`: decoded as 4-bit
    codes, the frag kernel's decode tiles and its dequantizer): bf16/fp16 activations, no or an integer zero point,
    scales per channel, per tensor or per whole 128-K blocks."""
    w, g = scheme.weight, scheme.granularity
    whole_blocks = g.kind in (ScaleKind.CHANNEL, ScaleKind.TENSOR) or g.k % 128 == 0
    plain = isinstance(w, IntType) and w.bits == 3 and not scheme.act.quantized and not scheme.global_scale
    return plain and whole_blocks and scheme.zero_point is not ZeroPoint.FLOAT


def dense_frag_format(scheme: Scheme) -> bool:
    """Weights the dense backend prepares in the fragment layout: `frag_format`'s, and 3-bit ones (`frag3_format`)."""
    return frag_format(scheme) or frag3_format(scheme)


def to_triton_layout(
    qw: QuantizedWeight, allow_nk: bool = True, allow_frag: bool = True, allow_e2m1_a8: bool = True,
    allow_int4_codes: bool = False, allow_frag3: bool = False,
) -> TritonWeight:  # fmt: skip
    """The dense kernels' layout (also each expert's in `stack_experts`); `allow_nk=False` keeps FP8
    weights in bit planes too, `allow_frag=False` keeps 4-bit weights in bit planes (for the bit-plane
    kernels). MXFP4 under e4m3 x per token whose rows `e2m1_row_scales` takes runs on the FP8 MMA
    (`TritonWeight.e2m1_a8`; `allow_e2m1_a8=False` or ANYBIT_E2M1_A8=0: as `codes_a16`). allow_int4_codes (the dense
    backend) and ANYBIT_W4A8_CODES=1: `int4_codes_scheme` weights with N < INT4_CODES_MAX_N as `codes_a16`, in the
    A16 order with bf16 scales (`TritonWeight.a16`). allow_frag3 (the dense backend): `frag3_format` weights in the
    fragment layout's 3-bit planes (the grouped MoE kernels keep them in bit planes)."""
    if len(qw.shape) != 2:
        raise ValueError(f"the dense Triton layout takes an (N, K) weight, got {qw.shape}")
    scheme = qw.scheme
    nk = allow_nk and fp8_as_is(scheme)
    frag = allow_frag and (dense_frag_format(scheme) if allow_frag3 else frag_format(scheme))
    bn, bk = qw.block
    zeros = qw.zeros.t().contiguous() if qw.zeros is not None else None
    gs = qw.global_scale.reshape(1).float().contiguous() if qw.global_scale is not None else None
    scales = qw.scales.t().contiguous()
    recipe = blockscaled_recipe(scheme, qw.n, qw.k, nk, frag)
    fold = _foldable(qw) if frag else frozenset()
    rowwise = e2m1_row_scales(qw, E2M1_A8_SPREAD_MAX) if frag else None  # rows of <= 11 binades
    lut = rowwise is not None and allow_e2m1_a8 and settings.e2m1_a8()  # MXFP4 on the FP8 MMA (`e2m1_a8`)
    if lut:  # the row-relative codes are the weight's scales from here on (the kernels read no others)
        scales, rowwise = rowwise[0], (rowwise[0], rowwise[1] * 2.0**-E2M1_A8_SHIFT)
    elif rowwise is not None and int(rowwise[0].min()) < 127 - ROW_SPREAD_MAX:
        rowwise = None  # the codes path's row-wise route: e4m3 of e2m1 * 2**r only to 8 binades
    int4 = frag and allow_int4_codes and int4_codes_scheme(scheme) and qw.n < INT4_CODES_MAX_N and settings.w4a8_codes()
    twin = a16_twin(scheme) if int4 else None
    cublas_scales = cublas_weight_scales(scales, recipe) if recipe else None  # (from the exact scales)
    if int4:
        scales = scales.to(torch.bfloat16)
    return TritonWeight(
        scheme=scheme,
        n=qw.n,
        k=qw.k,
        planes=_planes(qw, nk, frag, lut, a16=int4),
        plane_bits=PLANES[scheme.weight_bits],
        scales=scales,
        zeros=zeros,
        global_scale=gs,
        group_k=bk,
        group_n=bn,
        fmt=weight_format_constexprs(twin or scheme),
        nk=nk,
        frag=frag,
        codes_a16=(frag and codes_a16(scheme) and not lut) or int4,
        a16=twin,
        unit_scales=torch.ones_like(scales) if int4 and recipe else None,
        input_scale=qw.input_scale,
        fold=fold,
        fold_bits=bool(fold) and scale_bits_exact(qw),  # (read only where the decode folds)
        blockscaled=recipe,
        blockscaled_scales=cublas_scales,
        rowwise=rowwise,
        rescale=frag and not int4 and rescalable(qw),
    )


def rescale_scheme(scheme: Scheme) -> bool:
    """Integer weights on the FP8 MMA with one scale row per weight row: those whose scales `rescalable` reads."""
    return a8_mma(scheme) and isinstance(scheme.weight, IntType) and scheme.granularity.kind is not ScaleKind.BLOCK


def rescalable(qw: QuantizedWeight) -> bool:
    """Whether the frag kernels may accumulate this weight's integer codes under FP8 x in the MMA in units of each
    K block's scale (`frag.frag_rescale`): scales per channel or tensor, or per whole 128-K blocks all positive, in
    [2**-96, 2**96] and within `RESCALE_SPREAD` binades of each other (the accumulator is rescaled by their ratios,
    whose reciprocals are approximate for normal numbers only)."""
    if not rescale_scheme(qw.scheme):
        return False
    if qw.block[1] >= qw.k:
        return True
    s = qw.scales.float()
    lo, hi = float(s.min()), float(s.max())  # (NaN fails every comparison)
    return 2.0**-96 <= lo and hi <= 2.0**96 and hi <= lo * 2.0**RESCALE_SPREAD


def scale_bits_exact(qw: QuantizedWeight) -> bool:
    """Whether the folded frag decode may build e2m1 weights' group scales from their bits (`frag_fold` 2). ue8m0:
    always (the fold's range, 2**-15 <= scale < 2**9 for fp16, < 2**9 for bf16, keeps e + 118 / e - 106 a normal
    exponent field). e4m3 (code * 16 + 0x7700 is bf16 scale * 2**118, code * 128 + 0x3800 fp16 scale * 2**6): every
    scale non-negative and normal, or +0 over a group whose codes are all ±0 (+0 builds 2**111 / 0.5, times zero
    codes still 0)."""
    if not isinstance(qw.scheme.weight, FloatType) or qw.block[0] != 1:
        return False
    if qw.scheme.scale_dtype.name == "ue8m0":
        return True
    if qw.scheme.scale_dtype.name != "e4m3":
        return False
    b = qw.scales.view(torch.uint8)  # e4m3 codes
    if bool((b >= 0x80).any()) or bool(((b > 0) & (b < 8)).any()):
        return False  # a sign bit or a subnormal scale
    zero = b == 0
    if not bool(zero.any()):
        return True
    codes = qw.codes().reshape(*b.shape, qw.block[1])  # [N, K/g, g]
    return not bool(((codes & 7) != 0)[zero].any())


def _foldable(qw: QuantizedWeight) -> frozenset:
    """The activation dtypes for which the frag kernel may fold the e2m1 rebias into the group scales
    (`frag_fold`) exactly: e2m1 codes in groups shorter than the frag block, every |scale| < 2**9 (so
    scale * 2**118 is a finite bf16, * 2**6 a finite fp16: e4m3 scales always, ue8m0 up to 2**8); for
    fp16, products scale * code * 2**-8 must also keep their last bit above fp16's 2**-24: e4m3
    scales always, ue8m0 from 2**-15 (other float scales keep the plain decode there)."""
    if not isinstance(qw.scheme.weight, FloatType) or qw.block[1] >= 128:
        return frozenset()
    s = qw.scale_values().abs()
    if not bool(s.amax() < 2.0**9):
        return frozenset()
    name, nonzero = qw.scheme.scale_dtype.name, s[s > 0]
    tiny = nonzero.numel() > 0 and bool(nonzero.amin() < 2.0**-15)
    fp16 = name == "e4m3" or (name == "ue8m0" and not tiny)
    return frozenset({torch.bfloat16, torch.float16} if fp16 else {torch.bfloat16})


def _planes(qw: QuantizedWeight, nk: bool, frag: bool, e2m1_a8: bool = False, a16: bool = False) -> list[torch.Tensor]:
    if nk:
        return [qw.codes().view(torch_float8(qw.scheme.weight))]
    if frag:
        e2m1 = isinstance(qw.scheme.weight, FloatType)  # the fragment layout's one float format
        a8 = (a8_mma(qw.scheme) or e2m1_a8) and not a16
        if qw.scheme.weight_bits == 3:
            return [pack_frag3(stored_codes(qw))]
        return [pack_frag(stored_codes(qw), a8=a8, bits=qw.scheme.weight_bits, e2m1=e2m1)]
    return pack_planes(stored_codes(qw), qw.scheme.weight_bits)


def weight_format_constexprs(scheme: Scheme) -> dict:
    """The compile-time format description the kernels specialise on."""
    w, s = scheme.weight, scheme.scale_dtype
    is_float = isinstance(w, FloatType)
    if s.name == "ue8m0":
        scale_kind, s_exp, s_man = 2, 8, 0
    elif isinstance(s, FloatType):
        scale_kind, s_exp, s_man = 1, s.exp, s.man
    else:
        scale_kind, s_exp, s_man = 0, 0, 0
    return {
        "W_BITS": w.bits,
        "W_FLOAT": is_float,
        "W_SIGNED": w.signed,
        "W_EXP": w.exp if is_float else 0,
        "W_MAN": w.man if is_float else 0,
        "SCALE_KIND": scale_kind,
        "S_EXP": s_exp,
        "S_MAN": s_man,
        "ZP": {ZeroPoint.NONE: 0, ZeroPoint.INT: 1, ZeroPoint.FLOAT: 2}[scheme.zero_point],
    }


def stack_experts(qw: QuantizedWeight, allow_frag: bool = True) -> TritonWeight:
    """An (E, N, K) expert stack as the dense layout of each expert, stacked on a leading E axis. MXFP4 under e4m3 x
    runs on the FP8 MMA (`TritonWeight.e2m1_a8`) only when every expert's rows allow it; else all as `codes_a16`."""
    if len(qw.shape) != 3:
        raise ValueError(f"stack_experts takes an (E, N, K) weight, got {qw.shape}")
    experts = [qw.expert(e) for e in range(qw.shape[0])]
    parts = [to_triton_layout(q, allow_frag=allow_frag) for q in experts]
    if len({p.e2m1_a8 for p in parts}) > 1:  # some experts' rows span more than 11 binades
        parts = [to_triton_layout(q, allow_frag=allow_frag, allow_e2m1_a8=False) for q in experts]
    first = parts[0]

    def stack(name):
        ts = [getattr(p, name) for p in parts]
        return None if ts[0] is None else torch.stack(ts).contiguous()

    planes = [torch.stack([p.planes[i] for p in parts]).contiguous() for i in range(len(first.planes))]
    gs = stack("global_scale")
    scales, rowwise = stack("scales"), None
    if first.e2m1_a8:  # row-relative codes [E, K/g, N] (the scales) and the rows' powers of two [E, N]
        rowwise = (scales, torch.stack([p.rowwise[1] for p in parts]).contiguous())
    return TritonWeight(
        scheme=first.scheme, n=first.n, k=first.k, planes=planes, plane_bits=first.plane_bits,
        scales=scales, zeros=stack("zeros"), global_scale=gs.reshape(-1) if gs is not None else None,
        group_k=first.group_k, group_n=first.group_n, fmt=first.fmt, nk=first.nk, frag=first.frag,
        codes_a16=first.codes_a16,
        fold=frozenset.intersection(*(p.fold for p in parts)),
        fold_bits=all(p.fold_bits for p in parts),
        rowwise=rowwise,
        rescale=all(p.rescale for p in parts),
    )  # fmt: skip
