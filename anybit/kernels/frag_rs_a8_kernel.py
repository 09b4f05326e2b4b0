"""The register-operand wide W4A8 Gluon kernel of `anybit.kernels.frag_ws_a8` (sm_90a, large M): the wide kernel's
tile (128 weight rows by 256 tokens, the weight as the wgmma's A operand, the accumulator rescaled per 128-K block —
`frag_ws_a8_wide_kernel`) with the decoded weight in registers instead of shared memory.

Why: the wide kernel's decoders write each step's e4m3 weight to shared memory and its SS wgmma reads it back — per
128-K step ~144 KB of shared-memory traffic (wgmma 80 KB, TMA 40 KB, decoders 24 KB) for 1024 tensor-core cycles of
work, over the 128 bytes a cycle shared memory moves. Here each MMA warpgroup loads its 64 rows' words (8 KB a step
for both) in the A fragment's own thread order and decodes them in registers (`_a8_operand`): ~112 KB a step.

Per CTA tile, three partitions:

* loader (1 warp): each step's words and scale row (`_w_fetch`) and x's [256, 128] e4m3 box (`_x_issue`) into slot
  b % STAGES once both MMA warpgroups released it;
* two MMA warpgroups (weight rows 0-63 and 64-127, running free): per step the words (loaded while the step before
  ran), decoded to e4m3 (q - 8) / 512 in registers, the accumulator rescaled by each row's last scale over this one's,
  one 64 x 256 x 128 wgmma (four QGMMA) waited for before the next decode — no register operand is rewritten while a
  wgmma reads it (Triton #9433), and the other warpgroup's step keeps the tensor cores busy meanwhile.

Weights with group scales must be `TritonWeight.rescale`; channel scales accumulate the whole K. MXFP4 weights
(E2M1, `TritonWeight.e2m1_a8`) decode by their 32-K groups' tables of e4m3 bytes (`_e2m1_operand`) and accumulate
the whole K with no rescale. The K loop (`_rs_a8_steps`) also serves the stream-K form (`frag_rsw_a8_kernel`: from
ring step g0) and the grouped MoE kernel (`moe_rs_a8_kernel`: gathered x, blocks of two parts). Imported only where
it runs (Gluon + Hopper).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from anybit.kernels.frag_decode import _E2M1_A8, _LUT_HI_BASE, _LUT_HI_STEP, _LUT_LO_BASE, _LUT_LO_STEP
from anybit.kernels.frag_ws_a8_kernel import _a8_asm
from anybit.kernels.frag_ws_a8_wide_kernel import TINY, _a8_store, _wide_tile
from anybit.kernels.frag_ws_kernel import _w_fetch, _x_issue


@gluon.constexpr_function
def _bytes_layout():
    """A step's words of 64 weight rows as bytes [64 rows, 4 (t), 4 (c), 4 (byte i)] (word 4t + c), as the wgmma's
    8-bit A fragments want them: register bits i, c and row + 8, lane bits t = lane % 4 and row = lane // 4, warp
    bits rows of 16 — a thread's 16 bytes of a row are one contiguous load."""
    lanes = [[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [8, 0, 0, 0]],
        lane_bases=lanes,
        warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]],
        block_bases=[],
        shape=[64, 4, 4, 4],
    )


def _u32(v) -> str:
    return f"0x{int(getattr(v, 'value', v)) % (1 << 32):08X}"


# e2m1 codes under e4m3 x (`TritonWeight.e2m1_a8`): `frag_decode._E2M1_A8`'s table decode of a word, its group's
# two table words built first from the group's row-relative code (the low byte of $3: four copies of it)
_E2M1_RS = gl.constexpr(
    "{\n.reg .b32 c, lo, hi;\nand.b32 c, $3, 0xFF;\n"
    f"mad.lo.u32 lo, c, {_u32(_LUT_LO_STEP)}, {_u32(_LUT_LO_BASE)};\n"
    f"mad.lo.u32 hi, c, {_u32(_LUT_HI_STEP)}, {_u32(_LUT_HI_BASE)};\n"
    + _E2M1_A8.value.strip()[1:-1].replace("$3", "lo").replace("$4", "hi")
    + "}"
)


@gluon.constexpr_function
def _acc_layout(tokens):
    """A warpgroup's fp32 [64 weight rows, tokens] FP8 wgmma accumulator."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, tokens, 32])


# fmt: off
@gluon.jit
def _k_order(lo, hi, a_layout: gl.constexpr):
    """A step's bytes [64, 4 (t), 4 (c), 4 (i)] of k = 32c + 4t + i (lo) and k + 16 (hi), int8 -> [64, 128] e4m3 in
    K order as the wgmma's register operand (`a_layout`): a register renaming."""
    v = gl.join(lo, hi).to(gl.float8e4nv, bitcast=True)  # [64, t, c, i, j]: k = 32c + 16j + 4t + i
    v = gl.permute(v, [0, 2, 4, 1, 3])  # (row, c, j, t, i)
    return gl.convert_layout(gl.reshape(v, [64, 128]), a_layout)


@gluon.jit
def _a8_operand(words, SIGNED: gl.constexpr, a_layout: gl.constexpr):
    """A step's bytes [64, 4 (t), 4 (c), 4 (i)] (`_bytes_layout`; byte i of word 4t + c holds the codes of k = 32c +
    4t + i (low nibble) and k + 16 (high)) -> the step [64, 128] in e4m3 (q - 8) / 512 as the wgmma's register
    operand: `frag_ws_a8_kernel`'s decode, four bytes a register (pack=4), then `_k_order`."""
    r0, r1 = gl.inline_asm_elementwise(_a8_asm(SIGNED), "=r,=r,r", [words], dtype=(gl.int8, gl.int8),
                                       is_pure=True, pack=4)
    return _k_order(r0, r1, a_layout)


@gluon.jit
def _e2m1_operand(words, codes, a_layout: gl.constexpr):
    """A step's bytes of e2m1 words in the FP8 order (`frag_layout.e2m1_a8_bit_order`; the same K of every byte and
    nibble as `_a8_operand`'s) and each word's group code ([64, 4 (c)] row-relative ue8m0 codes) -> the step [64,
    128] in e4m3, each weight its e2m1 value times 2**(r + E2M1_A8_SHIFT) (`frag_decode.unpack_e2m1_a8`), as the
    wgmma's register operand."""
    c = codes.to(gl.int8, bitcast=True)
    c = gl.broadcast(gl.expand_dims(gl.expand_dims(c, 1), 3), words)[0]  # a byte of the code for every byte
    r0, r1 = gl.inline_asm_elementwise(_E2M1_RS, "=r,=r,r,r", [words, c], dtype=(gl.int8, gl.int8), is_pure=True,
                                       pack=4)
    return _k_order(r0, r1, a_layout)


@gluon.jit
def _step_codes(sq, ME: gl.constexpr, s):
    """Slot s's row-relative scale codes of this warpgroup's 64 rows ([4 groups, BN] uint8 as TMA wrote them) as
    [64 rows, 4 groups], in the layout `_e2m1_operand` broadcasts over the words' bytes (each thread its two rows'
    four codes)."""
    BN: gl.constexpr = sq.type.shape[2]
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    cl: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(3, _bytes_layout()))
    return sq.index(s)._reinterpret(gl.uint8, [4, BN], flat2).slice(ME * 64, 64, dim=1).permute((1, 0)).load(cl)


@gluon.jit
def _step_words(wq, sq, ready, ki, ME: gl.constexpr, rows_l: gl.constexpr):
    """Step ki's bytes of this warpgroup's 64 rows (`_bytes_layout`) and their scales (times 512, fp32, in the
    accumulator's rows), once its slot has landed."""
    STAGES: gl.constexpr = wq.type.shape[0]
    s = ki % STAGES
    words = _step_bytes(wq, ready, ki, ME)
    BN: gl.constexpr = 2 * 64
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sc = sq.index(s)._reinterpret(sq.dtype, [BN], flat1).slice(ME * 64, 64).load(rows_l).to(gl.float32) * 512.0
    return words, sc


@gluon.jit
def _step_bytes(wq, ready, ki, ME: gl.constexpr):
    """Step ki's words of this warpgroup's 64 rows as bytes (`_bytes_layout`), once its slot has landed."""
    STAGES: gl.constexpr = wq.type.shape[0]
    s = ki % STAGES
    mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
    BN: gl.constexpr = 2 * 64
    flat4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
    return wq.index(s)._reinterpret(gl.int8, [BN, 4, 4, 4], flat4).slice(ME * 64, 64).load(_bytes_layout())


@gluon.jit
def _rs_a8_loop(wq, sq, x_bufs, ready, x_ready, empty, ME: gl.constexpr, num_k, SIGNED: gl.constexpr,
                RESCALE: gl.constexpr, GATHER: gl.constexpr = False, DIAG: gl.constexpr = 0, g0=0,
                E2M1: gl.constexpr = False, rs_ptr=None, N=0, off_n=0):
    """One warpgroup's K loop over its 64 weight rows and the tile's tokens: returns the fp32 [64, BM] accumulator
    times the rows' scales (x's not applied). GATHER: x came by cp.async (`moe_rs_a8_kernel`). DIAG (timing only,
    wrong results): 1 the words' bytes as the operand, not decoded; 2 that and no rescale — what the decode and the
    rescale cost (`tools/probe_ws_a8.py --tiles wide=1:rs=1:diag=1`). g0: the ring's step count before this loop's
    first step (the persistent kernel's segments run on along one ring). E2M1: e2m1 words (`_rs_a8_steps`), the
    accumulator times its rows' powers of two (`rs_ptr` [N], this warpgroup's 64 rows of the tile from off_n)."""
    acc, _ = _rs_a8_steps(wq, sq, x_bufs, x_bufs, ready, x_ready, empty, ME, num_k, SIGNED, RESCALE, GATHER, DIAG,
                          g0, False, False, E2M1)
    if E2M1:
        rows = off_n + ME * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc.type.layout))
        acc = acc * gl.expand_dims(gl.load(rs_ptr + rows, mask=rows < N, other=0.0), 1)
    return acc


@gluon.jit
def _rs_a8_steps(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, ME: gl.constexpr, num_k, SIGNED: gl.constexpr,
                 RESCALE: gl.constexpr, GATHER: gl.constexpr, DIAG: gl.constexpr, g0, TWO: gl.constexpr, two,
                 E2M1: gl.constexpr = False):
    """`_rs_a8_loop`, and with TWO a second part of the tile's tokens (x2_bufs, [BM2, 128] a slot: the grouped
    kernel's blocks of two parts, 144 = 128 + 16 rows) multiplied by the same decoded operand into a second
    accumulator where `two` (its rows hold any); returns both (the second zero without TWO). E2M1: e2m1 words
    decoded by their groups' tables (`_e2m1_operand`: the scales are in the values, the FP8 MMA accumulates the
    whole K); the accumulators come back in units of the rows' powers of two (`TritonWeight.rowwise`)."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    STAGES: gl.constexpr = wq.type.shape[0]
    layout: gl.constexpr = _acc_layout(BM)
    layout2: gl.constexpr = _acc_layout(BM2)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=4)
    a2_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout2, k_width=4)
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    rows2_l: gl.constexpr = gl.SliceLayout(1, layout2)
    acc = gl.zeros((64, BM), dtype=gl.float32, layout=layout)
    acc2 = gl.zeros((64, BM2), dtype=gl.float32, layout=layout2)
    last = gl.full((64, ), 1.0, dtype=gl.float32, layout=rows_l)
    for i in range(num_k):
        ki = g0 + i
        s = ki % STAGES
        # the step's words here, not a step ahead over the back edge: carried there as bytes, each was taken apart
        # and packed again for the decode (sm_90a: 64 PRMT and 32 LOP3 a step)
        if E2M1:  # (the scales are in the values: no rescale)
            a = _e2m1_operand(_step_bytes(wq, ready, ki, ME), _step_codes(sq, ME, s), a_layout)
        else:
            words, sc = _step_words(wq, sq, ready, ki, ME, rows_l)
            if DIAG:
                a = _k_order(words, words, a_layout)
            else:
                a = _a8_operand(words, SIGNED, a_layout)
            if RESCALE and DIAG < 2:  # acc in units of this step's scales (the last step's wgmma has retired)
                sc = gl.maximum(sc, TINY)
                ratio = last / sc
                acc = acc * gl.expand_dims(ratio, 1)
                if TWO:  # (the rows' layout is the same at any N: a renaming)
                    acc2 = acc2 * gl.expand_dims(gl.convert_layout(ratio, rows2_l), 1)
                last = sc
            elif i == 0:  # one scale row for every step
                last = sc
        mbarrier.wait(x_ready.index(s), (ki // STAGES) & 1)
        if GATHER:
            fence_async_shared()  # x came through the generic proxy; the wgmma reads it through the async one
        acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        # waited for before the next step's decode: its registers must not be rewritten while the wgmma reads them
        # (the wait's deps cannot hold 8-bit operands: nothing else is computed between the two)
        if TWO:  # (an async wgmma's result cannot leave a branch: this one waits for both)
            if two:
                acc2 = warpgroup_mma(gl.convert_layout(a, a2_layout), x2_bufs.index(s).permute((1, 0)), acc2)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(s), count=1)  # done with the step's x, words and scales
    return acc * gl.expand_dims(last, 1), acc2 * gl.expand_dims(gl.convert_layout(last, rows2_l), 1)


@gluon.jit
def _rs_a8_mma(wq, sq, x_bufs, ready, x_ready, empty, ME: gl.constexpr, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym,
               off_m, off_n, num_k, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, RESCALE: gl.constexpr,
               DIAG: gl.constexpr, CVT: gl.constexpr, E2M1: gl.constexpr, rs_ptr):
    """One warpgroup's 64 weight rows of the tile: the K loop (`_rs_a8_loop`), then y = acc * x scale (+ bias)."""
    acc = _rs_a8_loop(wq, sq, x_bufs, ready, x_ready, empty, ME, num_k, SIGNED, RESCALE, False, DIAG, 0, E2M1,
                      rs_ptr, N, off_n)
    _a8_store(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n + ME * 64, HAS_BIAS, CVT)


@gluon.jit
def _rs_a8_loader(w_desc, s_desc, x_desc, wq, sq, x_bufs, ready, x_ready, empty, off_m, off_n, nb, num_k,
                  SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr):
    """Step b's words and scale row (`_w_fetch`) and x's box (`_x_issue`) into slot b % STAGES once both MMA
    warpgroups released it."""
    STAGES: gl.constexpr = wq.type.shape[0]
    for b in range(num_k):
        s = b % STAGES
        mbarrier.wait(empty.index(s), ((b // STAGES) & 1) ^ 1)
        _w_fetch(w_desc, s_desc, wq, sq, ready, s, 0, 0, off_n // PANEL, nb, off_n, b, num_k, GB, SCALE_PER_BLOCK)
        _x_issue(x_desc, x_bufs, x_ready, off_m, b, num_k, STAGES)


@gluon.jit
def _rs_a8_rings(x_layout: gl.constexpr, w_desc, s_desc, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                 X_ARRIVALS: gl.constexpr):
    """The register-operand W4A8 kernels' shared memory: STAGES slots of x (e4m3 [BM, 128]; its barrier counts
    X_ARRIVALS: 1 for TMA, every loader thread for gathered rows), of the tile's words (64-row panels of 4 x 256
    int32) and of its scale row(s), their ready barriers and one empty barrier a slot (both MMA warpgroups)."""
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], x_layout)
    wq = gl.allocate_shared_memory(gl.int32, [STAGES, BN // 16, 256], w_desc.layout)
    SG: gl.constexpr = s_desc.block_type.shape[0]  # scale rows a step: one, or e2m1's four group codes
    sq = gl.allocate_shared_memory(s_desc.dtype, [STAGES, SG, BN], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(x_ready.index(i), count=X_ARRIVALS)
        mbarrier.init(empty.index(i), count=2)
    return x_bufs, wq, sq, ready, x_ready, empty


@gluon.jit
def frag_rs_a8_kernel(x_desc, w_desc, s_desc, xs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym, rs_ptr,
                      BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr,
                      SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr,
                      PANEL: gl.constexpr, RESCALE: gl.constexpr, DIAG: gl.constexpr = 0, CVT: gl.constexpr = False,
                      E2M1: gl.constexpr = False):
    BM: gl.constexpr = x_desc.block_type.shape[0]  # tokens: the wgmma's N
    off_m, off_n, num_k = _wide_tile(x_desc, M, N, K, BN, GROUP_M)
    x_layout: gl.constexpr = x_desc.layout
    x_bufs, wq, sq, ready, x_ready, empty = _rs_a8_rings(x_layout, w_desc, s_desc, BM, BN, STAGES, 1)
    gl.warp_specialize([  # MMA warpgroups (weight rows 0-63, 64-127), loader
        (_rs_a8_mma, (wq, sq, x_bufs, ready, x_ready, empty, 0, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m,
                      off_n, num_k, SIGNED, HAS_BIAS, RESCALE, DIAG, CVT, E2M1, rs_ptr)),
        (_rs_a8_mma, (wq, sq, x_bufs, ready, x_ready, empty, 1, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m,
                      off_n, num_k, SIGNED, HAS_BIAS, RESCALE, DIAG, CVT, E2M1, rs_ptr)),
        (_rs_a8_loader, (w_desc, s_desc, x_desc, wq, sq, x_bufs, ready, x_ready, empty, off_m, off_n, nb, num_k,
                         SCALE_PER_BLOCK, GB, PANEL)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
