"""Triton device helpers that turn packed weight codes into values, specialised by constexpr format.

Weight layout read here (written by `anybit.backends.triton_layout`): a code of b bits is split
into bit planes whose widths divide 32 (3 = 2+1, 5 = 4+1, 6 = 4+2, 7 = 4+2+1; 1, 2, 4, 8 are one
plane), lowest bits in plane 0. Plane p of width w is an int32 tensor [K_pad*w/32, N]: word row r,
column n holds the codes of k = r*(32/w) … r*(32/w) + 32/w - 1 at bit (k % (32/w))*w — packed along
K, contiguous along N so a tile's loads are coalesced across output columns. Signed integer codes are
stored biased (sign bit flipped: value + 2**(b-1)), so every integer decodes as an unsigned one.
"""

import triton
import triton.language as tl


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints (triton.cdiv costs microseconds per call in newer Triton)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (>= 1) for host ints (triton.next_power_of_2: ~2 µs per call)."""
    return 1 << max(n - 1, 0).bit_length()


def plane_args(planes: list, plane_bits: tuple[int, ...]) -> tuple[list, tuple[int, int, int]]:
    """Launcher helper: the three plane pointers and widths the kernels take (unused ones: width 0)."""
    ptrs = list(planes) + [planes[0]] * (3 - len(planes))
    return ptrs, tuple(plane_bits) + (0,) * (3 - len(plane_bits))


@triton.jit
def _load_words(ptr, k0, offs_n, mask_n, K, N, BLOCK_K: tl.constexpr, WIDTH: tl.constexpr):
    """The packed words of the K tile at k0 (a multiple of BLOCK_K): int32 [BLOCK_K*WIDTH/32, BN]."""
    per_word: tl.constexpr = 32 // WIDTH
    rows = k0 // per_word + tl.arange(0, BLOCK_K // per_word)
    mask = (rows * per_word < K)[:, None] & mask_n[None, :]
    return tl.load(ptr + rows[:, None] * N + offs_n[None, :], mask=mask, other=0)


@triton.jit
def load_plane(ptr, k0, offs_n, mask_n, K, N, BLOCK_K: tl.constexpr, WIDTH: tl.constexpr):
    """Codes of one plane for the K tile starting at k0 as int32 [BLOCK_K, BN]. Each packed word is
    loaded once and split by shifts in registers."""
    words = _load_words(ptr, k0, offs_n, mask_n, K, N, BLOCK_K, WIDTH)
    if WIDTH == 32:
        codes = words
    else:
        shifts = tl.arange(0, 32 // WIDTH) * WIDTH
        vals = (words[:, None, :] >> shifts[None, :, None]) & ((1 << WIDTH) - 1)
        codes = tl.reshape(vals, (BLOCK_K, words.shape[1]))
    return codes


@triton.jit
def load_codes(
    p0_ptr,
    p1_ptr,
    p2_ptr,
    k0,
    offs_n,
    mask_n,
    K,
    N,
    BLOCK_K: tl.constexpr,
    W0: tl.constexpr,
    W1: tl.constexpr,
    W2: tl.constexpr,
):
    """The full code (all planes) of the [BLOCK_K, BN] tile at k0 as int32."""
    codes = load_plane(p0_ptr, k0, offs_n, mask_n, K, N, BLOCK_K, W0)
    if W1 > 0:
        codes |= load_plane(p1_ptr, k0, offs_n, mask_n, K, N, BLOCK_K, W1) << W0
    if W2 > 0:
        codes |= load_plane(p2_ptr, k0, offs_n, mask_n, K, N, BLOCK_K, W2) << (W0 + W1)
    return codes


@triton.jit
def load_pairs(ptr, k0, offs_n, mask_n, K, N, BLOCK_K: tl.constexpr, WIDTH: tl.constexpr, DTYPE: tl.constexpr):
    """Unsigned codes of a single-plane format of WIDTH 2 or 4 as DTYPE (bf16/fp16) values
    MAGIC + code, exactly: [BLOCK_K, BN] (MAGIC = 128 for bf16, 1024 for fp16). Two codes per
    instruction pair: the codes at bits j*WIDTH and j*WIDTH + 16 of a word are shifted down together,
    masked and OR-ed under the exponent of MAGIC in both 16-bit halves."""
    half: tl.constexpr = 16 // WIDTH
    if DTYPE == tl.bfloat16:
        magic: tl.constexpr = 0x43004300
    else:
        magic: tl.constexpr = 0x64006400
    words = _load_words(ptr, k0, offs_n, mask_n, K, N, BLOCK_K, WIDTH)
    shifts = tl.arange(0, half) * WIDTH
    pairs = ((words[:, None, :] >> shifts[None, :, None]) & (((1 << WIDTH) - 1) * 0x00010001)) | magic
    lo = pairs.to(tl.int16).to(DTYPE, bitcast=True)
    hi = (pairs >> 16).to(tl.int16).to(DTYPE, bitcast=True)
    v = tl.permute(tl.join(lo, hi), (0, 3, 1, 2))  # [rows, 2, half, BN]: code index = h*half + j
    return tl.reshape(v, (BLOCK_K, words.shape[1]))


@triton.jit
def small_uint_to_f32(u):
    """Exact fp32 of an int32 in [0, 2**23) without I2F (a quarter-rate instruction on Hopper):
    OR the bits under the exponent of 2**23, then subtract 2**23."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def decode_int(codes, BITS: tl.constexpr, SIGNED: tl.constexpr):
    """int32 codes -> fp32 values of uintB, or of intB stored biased (value + 2**(BITS-1): the sign
    bit flipped at prepare time, see `anybit.backends.triton_layout`)."""
    if SIGNED:
        return small_uint_to_f32(codes) - (1 << (BITS - 1))
    return small_uint_to_f32(codes)


@triton.jit
def decode_float(codes, EXP: tl.constexpr, MAN: tl.constexpr, SIGNED: tl.constexpr, POW2: tl.constexpr = 0):
    """int32 codes of an eXmY float -> fp32 values times 2**POW2, exactly (finite codes; no inf/NaN
    handling: the quantizer never emits them).
    EXP <= 4: the fields are placed into fp16 bits (sign at bit 15, exponent and mantissa ending at
    fp16's mantissa top), which hold value * 2**(bias - 15) exactly, subnormals included; one
    conversion and one multiply by a power of two give the value.
    Wider exponents: fp32 bits with the exponent re-biased; subnormal (exponent field 0):
    mantissa * 2**(1 - bias - MAN)."""
    bias: tl.constexpr = (1 << (EXP - 1)) - 1
    if EXP <= 4:
        h = (codes & ((1 << (EXP + MAN)) - 1)) << (10 - MAN)
        if SIGNED:
            h |= (codes << (15 - EXP - MAN)) & 0x8000
        v = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * (2.0 ** (15 - bias + POW2))
    else:
        e = (codes >> MAN) & ((1 << EXP) - 1)
        m = codes & ((1 << MAN) - 1)
        normal = (((e + (127 - bias)) << 23) | (m << (23 - MAN))).to(tl.float32, bitcast=True)
        sub = small_uint_to_f32(m) * (2.0 ** (1 - bias - MAN))
        v = tl.where(e == 0, sub, normal)
        if SIGNED:
            v = tl.where(((codes >> (EXP + MAN)) & 1) != 0, -v, v)
        if POW2 != 0:
            v = v * (2.0**POW2)
    return v


@triton.jit
def decode_weight(
    codes, BITS: tl.constexpr, IS_FLOAT: tl.constexpr, SIGNED: tl.constexpr, EXP: tl.constexpr, MAN: tl.constexpr
):
    if IS_FLOAT:
        return decode_float(codes, EXP, MAN, SIGNED)
    return decode_int(codes, BITS, SIGNED)


@triton.jit
def load_scale(ptr, rows, cols, mask, stride, KIND: tl.constexpr, EXP: tl.constexpr, MAN: tl.constexpr):
    """Scales at [rows, cols] (broadcastable index tensors) -> fp32.
    KIND 0: stored as fp16/bf16/fp32; 1: 8-bit float codes (e4m3/e5m2); 2: ue8m0 codes."""
    return decode_scale(tl.load(ptr + rows * stride + cols, mask=mask, other=0), KIND, EXP, MAN)


@triton.jit
def decode_scale(raw, KIND: tl.constexpr, EXP: tl.constexpr, MAN: tl.constexpr, POW2: tl.constexpr = 0):
    """Stored scales (as loaded) -> fp32 times 2**POW2 (POW2 > 0 folded into the decode; the caller
    makes sure the product is finite), KIND as in `load_scale`."""
    if KIND == 0:
        if POW2 != 0:
            return raw.to(tl.float32) * (2.0**POW2)
        return raw.to(tl.float32)
    if KIND == 1 and EXP == 4 and MAN == 3 and POW2 != 0:
        # e4m3 by the hardware conversion (sm_89+: two codes per cvt to f16x2; the folded frag decode
        # decodes every scale in each of the 4 lanes sharing its row, so this is its hot path)
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * (2.0**POW2)
    codes = raw.to(tl.int32)
    if KIND == 1:
        return decode_float(codes, EXP, MAN, True, POW2)
    if POW2 > 0:  # ue8m0 times 2**POW2: exponent field code + POW2 (code 0 included)
        return ((codes + POW2) << 23).to(tl.float32, bitcast=True)
    # ue8m0: 2**(code - 127); code 0 is 2**-127, an fp32 subnormal (bit 22 set)
    return tl.where(codes == 0, 0x00400000, codes << 23).to(tl.float32, bitcast=True)
