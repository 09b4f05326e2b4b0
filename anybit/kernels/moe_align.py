"""`moe_align` in four small Triton launches (the torch version is ~15 ops, 60–150 µs on the H200), or
for <= CHUNK entries (decode) in one (`_align_one`, which works from the entries alone, never per expert):
same outputs, element for element, including the order of tokens within an expert (stable: by flat
index), so it is deterministic and matches the reference.

1. `_hist`: per chunk of CHUNK flat entries, how many go to each expert            hist [C, E]
   (and how many ids are >= E, for the check), and the chunk's share of sorted_ids filled with the sentinel
2. `_bases`: per expert, the exclusive prefix of its counts over chunks, and its total    base [C, E], count [E]
3. `_offsets` (one program, E values): the totals padded to block_m, their cumsum → each expert's segment
   start and end, the padded total, and the check's verdict
4. `_scatter`: each entry's position = segment start + base[chunk, expert] + its rank among the chunk's entries
   of that expert (a CHUNK × CHUNK comparison) → sorted_ids; and the expert of the chunk's share of the blocks
(`_offsets` summed hist over the chunks and found every block's expert in one program before: 6-25 µs of a 16-48 µs
call on the H200 at 2048-32768 entries.)

The ids are read as given (int32 or int64): no cast, fill or check launches of their own.
Fixed output sizes, no host synchronisation: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anybit.errors import AnybitError
from anybit.kernels.dequant import cdiv, next_pow2

CHUNK = 128


# fmt: off
@triton.jit
def _local_ids(ids_ptr, map_ptr, offs, numel, E, HAS_MAP: tl.constexpr):
    """Local expert of each flat entry (int32), or E where it has none (-1, not on this rank, out of range)."""
    e = tl.load(ids_ptr + offs, mask=offs < numel, other=-1)
    if HAS_MAP:
        e = tl.where(e >= 0, tl.load(map_ptr + tl.maximum(e, 0), mask=(offs < numel) & (e >= 0), other=-1), e)
    return tl.where((e >= 0) & (e < E), e, E).to(tl.int32)


@triton.jit
def _hist(ids_ptr, map_ptr, hist_ptr, bad_ptr, sorted_ptr, numel, E, n_sorted, fill, HAS_MAP: tl.constexpr,
          CHUNK: tl.constexpr, E_P2: tl.constexpr, CHECK: tl.constexpr, FB: tl.constexpr):
    """Chunk c's histogram of local experts; CHECK: its count of ids >= E; and sorted_ids[c * fill, (c + 1) * fill)
    set to the sentinel (numel) — `_scatter`, launched after, writes the real entries over it."""
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    if CHECK:
        raw = tl.load(ids_ptr + offs, mask=offs < numel, other=0)
        tl.store(bad_ptr + c, tl.sum((raw >= E).to(tl.int32), axis=0))
    key = _local_ids(ids_ptr, map_ptr, offs, numel, E, HAS_MAP)
    h = tl.histogram(key, E_P2)
    e = tl.arange(0, E_P2)
    tl.store(hist_ptr + c * E + e, h, mask=e < E)
    hi = tl.minimum(c * fill + fill, n_sorted)
    for s0 in range(c * fill, hi, FB):
        s = s0 + tl.arange(0, FB)
        tl.store(sorted_ptr + s, tl.zeros_like(s) + numel, mask=s < hi)


@triton.jit
def _chunk_positions(key, base_ptr, seg_ptr, sorted_ptr, offs, E, CHUNK: tl.constexpr):
    """Each valid entry of a chunk to seg[its expert] + base[its expert] + its rank among the chunk's entries of that
    expert."""
    i = tl.arange(0, CHUNK)
    valid = key < E
    before = (key[:, None] == key[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(before.to(tl.int32), axis=1)
    pos = tl.load(seg_ptr + key, mask=valid, other=0) + tl.load(base_ptr + key, mask=valid, other=0) + rank
    tl.store(sorted_ptr + pos, offs.to(tl.int32), mask=valid)


@triton.jit
def _align_one(ids_ptr, map_ptr, sorted_ptr, expert_ptr, total_ptr, ok_ptr, numel, E, n_sorted, n_blocks,
               HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, MAXB: tl.constexpr,
               SB: tl.constexpr, CHECK: tl.constexpr):
    """The whole alignment of <= CHUNK entries (decode) in one program, with no work per expert (E = 256
    made the per-expert histogram, scan and block search cost ~15 µs): every entry finds its expert's
    count, its rank in it and its segment's start among the entries themselves (CHUNK x CHUNK compares);
    the first entry of each expert writes that expert into its blocks. Sentinel fills of sorted_ids and
    expert_ids first, then a barrier, then the scatters. CHECK: ok = 1 when no id is >= E, else 0."""
    offs = tl.arange(0, CHUNK)
    if CHECK:
        raw = tl.load(ids_ptr + offs, mask=offs < numel, other=0)
        tl.store(ok_ptr, (tl.max(raw, axis=0) < E).to(tl.int32))
    key = _local_ids(ids_ptr, map_ptr, offs, numel, E, HAS_MAP)
    valid = key < E
    same = key[:, None] == key[None, :]
    rank = tl.sum((same & (offs[None, :] < offs[:, None])).to(tl.int32), axis=1)
    first = valid & (rank == 0)  # one entry per expert present
    padded = (tl.sum(same.to(tl.int32), axis=1) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    before = (key[None, :] < key[:, None]) & first[None, :]
    start = tl.sum(tl.where(before, padded[None, :], 0), axis=1)
    tl.store(total_ptr, tl.sum(tl.where(first, padded, 0), axis=0))
    for s0 in range(0, n_sorted, SB):
        s = s0 + tl.arange(0, SB)
        tl.store(sorted_ptr + s, tl.zeros_like(s) + numel, mask=s < n_sorted)
    for b0 in range(0, n_blocks, SB):
        b = b0 + tl.arange(0, SB)
        tl.store(expert_ptr + b, tl.zeros_like(b) - 1, mask=b < n_blocks)
    tl.debug_barrier()
    tl.store(sorted_ptr + start + rank, offs.to(tl.int32), mask=valid)
    j = tl.arange(0, MAXB)
    blocks = start[:, None] // BLOCK_M + j[None, :]
    own = first[:, None] & (j[None, :] < (padded // BLOCK_M)[:, None])
    tl.store(expert_ptr + blocks, key[:, None] + tl.zeros_like(blocks), mask=own)


@triton.jit
def _bases(hist_ptr, base_ptr, count_ptr, C, E, EB: tl.constexpr, CB: tl.constexpr):
    """For EB experts: each chunk's exclusive prefix of their counts over the chunks before it (base [C, E]), and
    their totals (count [E])."""
    e = tl.program_id(0) * EB + tl.arange(0, EB)
    carry = tl.zeros((EB,), dtype=tl.int32)
    for c0 in range(0, C, CB):
        rows = c0 + tl.arange(0, CB)
        mask = (rows < C)[:, None] & (e < E)[None, :]
        tile = tl.load(hist_ptr + rows[:, None] * E + e[None, :], mask=mask, other=0)
        incl = tl.cumsum(tile, axis=0)
        tl.store(base_ptr + rows[:, None] * E + e[None, :], carry[None, :] + incl - tile, mask=mask)
        carry += tl.sum(tile, axis=0)
    tl.store(count_ptr + e, carry, mask=e < E)


@triton.jit
def _offsets(count_ptr, bad_ptr, ok_ptr, seg_ptr, end_ptr, total_ptr, C, E, BLOCK_M: tl.constexpr,
             E_P2: tl.constexpr, CB: tl.constexpr, CHECK: tl.constexpr):
    """From the experts' counts: each one's padded segment (start seg, end), the padded total; CHECK: ok = 1 when no
    chunk saw an id >= E, else 0."""
    if CHECK:
        bad = tl.zeros((CB,), dtype=tl.int32)
        for c0 in range(0, C, CB):
            rows = c0 + tl.arange(0, CB)
            bad += tl.load(bad_ptr + rows, mask=rows < C, other=0)
        tl.store(ok_ptr, (tl.sum(bad, axis=0) == 0).to(tl.int32))
    e = tl.arange(0, E_P2)
    padded = (tl.load(count_ptr + e, mask=e < E, other=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    tl.store(seg_ptr + e, end - padded, mask=e < E)
    tl.store(end_ptr + e, end, mask=e < E)
    tl.store(total_ptr, tl.sum(padded, axis=0))


@triton.jit
def _scatter(ids_ptr, map_ptr, base_ptr, seg_ptr, end_ptr, sorted_ptr, expert_ptr, numel, E, n_blocks, per,
             HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr,
             BB: tl.constexpr):
    """Chunk c's entries to their places in sorted_ids (`_chunk_positions`), and the expert of blocks [c * per,
    (c + 1) * per): how many segments end at or before the block's first row (-1 past the last)."""
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    key = _local_ids(ids_ptr, map_ptr, offs, numel, E, HAS_MAP)
    _chunk_positions(key, base_ptr + c * E, seg_ptr, sorted_ptr, offs, E, CHUNK)
    e = tl.arange(0, E_P2)
    end = tl.load(end_ptr + e, mask=e < E, other=2147483647)
    hi = tl.minimum(c * per + per, n_blocks)
    for b0 in range(c * per, hi, BB):
        b = b0 + tl.arange(0, BB)
        expert = tl.sum((end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ptr + b, tl.where(expert < E, expert, -1), mask=b < hi)
# fmt: on


def assert_ids(ok: torch.Tensor, what: str) -> None:
    """ok (a one-element tensor) must be nonzero: on a GPU a device-side assert (no host synchronisation),
    on the CPU an AnybitError naming `what`."""
    if ok.is_cuda:
        torch._assert_async(ok, what)
    elif not bool(ok):
        raise AnybitError(what)


def moe_align_triton(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    expert_map: torch.Tensor | None = None,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`anybit.moe.moe_align`'s contract, on the GPU (or the Triton interpreter). check (no expert_map): ids
    >= num_experts are an error (`assert_ids`; the decode launch finds them itself: one assert kernel
    instead of four torch ops)."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1)  # int32 / int64 read as they are (a cast would be a launch of its own)
    flat = (flat if flat.dtype in (torch.int32, torch.int64) else flat.to(torch.int32)).contiguous()
    numel, e = flat.numel(), num_experts
    max_padded = numel + e * (block_m - 1)
    n_blocks = cdiv(max_padded, block_m)
    chunks = max(1, cdiv(numel, CHUNK))
    e_p2 = next_pow2(e + 1)  # one bin more: entries without a local expert
    emap = expert_map.to(torch.int32).contiguous() if expert_map is not None else flat
    expert_ids = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    has_map = expert_map is not None
    check = check and not has_map
    why = f"expert id out of range for {e} experts"
    if numel <= CHUNK:  # decode: one launch instead of a fill and four (H200 graphs: ~12 µs for the five)
        sorted_ids = torch.empty((max_padded,), dtype=torch.int32, device=dev)
        ok = torch.empty(1, dtype=torch.int32, device=dev) if check else total
        # as many lanes as entries (a power of two >= 16): one token's top-8 compares 16 x 16, not 128 x 128
        lanes = max(16, next_pow2(numel))
        _align_one[(1,)](flat, emap, sorted_ids, expert_ids, total, ok, numel, e, max_padded, n_blocks,
                         HAS_MAP=has_map, CHUNK=lanes, BLOCK_M=block_m, MAXB=next_pow2(cdiv(lanes, block_m)),
                         SB=1024, CHECK=check, num_warps=8 if lanes == CHUNK else 4)  # fmt: skip
        if check:
            assert_ids(ok, why)
        return sorted_ids, expert_ids, total
    seg, end, counts = torch.empty((3, e), dtype=torch.int32, device=dev)
    hist = torch.empty((chunks, e), dtype=torch.int32, device=dev)
    base = torch.empty((chunks, e), dtype=torch.int32, device=dev)
    bad = torch.empty(chunks if check else 1, dtype=torch.int32, device=dev)
    ok = torch.empty(1, dtype=torch.int32, device=dev) if check else total
    sorted_ids = torch.empty((max_padded,), dtype=torch.int32, device=dev)  # (the sentinel: `_hist`)
    _hist[(chunks,)](flat, emap, hist, bad, sorted_ids, numel, e, max_padded, cdiv(max_padded, chunks),
                     HAS_MAP=has_map, CHUNK=CHUNK, E_P2=e_p2, CHECK=check, FB=1024)  # fmt: skip
    eb = min(16, next_pow2(e))
    _bases[(cdiv(e, eb),)](hist, base, counts, chunks, e, EB=eb, CB=64)
    _offsets[(1,)](counts, bad, ok, seg, end, total, chunks, e, BLOCK_M=block_m, E_P2=e_p2, CB=1024, CHECK=check)
    if check:
        assert_ids(ok, why)
    per = cdiv(n_blocks, chunks)  # blocks a scatter program labels (2 at 4096 tokens x 8: 16 lanes, not 64)
    bb = min(64, max(16, next_pow2(per)))
    _scatter[(chunks,)](flat, emap, base, seg, end, sorted_ids, expert_ids, numel, e, n_blocks, per, HAS_MAP=has_map,
                        CHUNK=CHUNK, BLOCK_M=block_m, E_P2=e_p2, BB=bb, num_warps=8)  # fmt: skip
    return sorted_ids, expert_ids, total
