"""A model of the persistent stream-K register-operand kernel's rings (`frag_rsp_kernel`, work in progress) under
random schedules, on `test_frag_rs_ring`'s ring: a CTA's run (`frag_rsp.shares`: segments of tiles) as one run of
blocks g = 0, 1, ..., owned by parity, the words read ahead across segments, and at each warpgroup's last block of a
segment the hand-over of the second's partial products through their own buffer (`red_bar[0]`: landed, `red_bar[1]`:
taken). Checks that every block's words and x are the ones waited for, that each segment sums each of its blocks once,
and that a partial is never overwritten before it is taken — and that without the wait for `red_bar[1]` one is. And
the runs themselves: every block of every tile in exactly one run, the kernel's `_owner` / `_slot` arithmetic. Keep it
in step with `_p_mma`, `_p_loader`, `_run`, `_segment`."""

import random

import pytest

from anybit.kernels.frag_rsp import shares
from tests.kernels.test_frag_rs_ring import _Barrier, _Hang, _loader, _Ring, _schedule


class _Red:
    def __init__(self):
        self.full, self.empty = _Barrier(), _Barrier()
        self.holding = None  # (segment, its blocks) in the buffer


def _warpgroup(ring: _Ring, red: _Red, me: int, run: list, guard: bool, wait_taken: bool):
    """`_p_mma`'s order over the run's segments (tile, kb_lo, kb_hi): blocks are numbered along the run."""
    stages = ring.stages
    starts = [0]
    for _, lo, hi in run:
        starts.append(starts[-1] + hi - lo)
    total = starts[-1]

    def read(g):
        s = g % stages
        if guard:
            yield lambda: ring.empty[s].passes(((g // stages) & 1) ^ 1)
        yield lambda: ring.ready[s].passes((g // stages) & 1)
        if ring.words[s] != g:
            ring.wrong.append(f"warpgroup {me} read block {ring.words[s]}'s words as block {g}'s")

    mine = list(range(me, total, 2))
    acc = []
    yield from read(mine[0])
    for i, g in enumerate(mine):
        s = g % stages
        yield lambda g=g, s=s: ring.x_ready[s].passes((g // stages) & 1)
        if ring.x[s] != g:
            ring.wrong.append(f"warpgroup {me}'s wgmma read block {ring.x[s]}'s x as block {g}'s")
        ring.reading[s] = me
        yield from read(mine[min(i + 1, len(mine) - 1)])
        yield lambda: True  # the wgmma's wait
        ring.reading[s] = None
        ring.empty[s].completed += 1
        acc.append(g)
        j = max(i for i in range(len(run)) if starts[i] <= g)  # g's segment
        if g + 2 < starts[j + 1]:
            continue
        if me == 1:  # the partial into the buffer once the previous one is taken
            if wait_taken:
                yield lambda j=j: red.empty.passes((j & 1) ^ 1)
            if red.holding is not None:
                ring.wrong.append(f"segment {j}'s partial written over segment {red.holding[0]}'s")
            red.holding = (j, acc)
            red.full.completed += 1
        else:
            yield lambda j=j: red.full.passes(j & 1)
            if red.holding is None or red.holding[0] != j:
                ring.wrong.append(f"segment {j} took {red.holding and red.holding[0]}'s partial")
            elif sorted(acc + red.holding[1]) != list(range(starts[j], starts[j + 1])):
                ring.wrong.append(f"segment {j} summed blocks {sorted(acc + red.holding[1])}")
            red.holding = None
            red.empty.completed += 1
        acc = []


def _run(stages: int, run: list, seed: int, wait_taken: bool = True) -> list[str]:
    rng = random.Random(seed)
    ring, red = _Ring(stages), _Red()
    guard = stages % 2 == 1
    total = sum(hi - lo for _, lo, hi in run)
    actors = [_loader(ring, total)] + [_warpgroup(ring, red, me, run, guard, wait_taken) for me in (0, 1)]
    return _schedule(ring, actors, rng, f"stages={stages} run={run} seed={seed}")


@pytest.mark.parametrize("stages", [3, 4, 5, 6])
@pytest.mark.parametrize("tiles, nb, ctas", [(1, 2, 1), (3, 2, 1), (2, 3, 1), (4, 3, 3), (3, 5, 2), (5, 8, 3),
                                             (7, 7, 4)])  # fmt: skip
def test_each_segment_sums_its_blocks_once_and_reads_only_its_own(stages, tiles, nb, ctas):
    for q, run in enumerate(shares(tiles, nb, ctas)):
        for seed in range(60):
            assert _run(stages, run, seed) == [], (q, seed)


def _owner(u: int, units: int, ctas: int) -> int:  # `frag_rsp_kernel._owner`
    return ((u + 1) * ctas + units - 1) // units - 1


@pytest.mark.parametrize("tiles, nb, ctas", [(448, 64, 132), (448, 63, 132), (64, 56, 132), (64, 3, 132),
                                             (1, 2, 1), (7, 11, 5), (128, 16, 132), (33, 5, 132)])  # fmt: skip
@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "blocks"])  # frag_rsp_kernel, frag_rsw_kernel
def test_runs_cover_every_block_once_and_the_kernel_finds_their_owners(tiles, nb, ctas, pairs):
    h = nb // 2 if pairs else nb
    units = tiles * h
    ctas = min(ctas, units)  # (the host's grid)
    runs = shares(tiles, nb, ctas, pairs)
    seen = {}
    for q, run in enumerate(runs):
        assert run, q
        for i, (t, lo, hi) in enumerate(run):
            assert hi - lo >= (2 if pairs else 1) and (i == 0 or lo == 0) and (i == len(run) - 1 or hi == nb), (q, run)
            for kb in range(lo, hi):
                assert (t, kb) not in seen
                seen[t, kb] = q
        ts = [t for t, _, _ in run]
        assert ts == list(range(ts[0], ts[-1] + 1))
    assert sorted(seen) == [(t, kb) for t in range(tiles) for kb in range(nb)]
    for t in range(tiles):  # the CTAs sharing tile t: `_owner` of its first and last unit, each its slot
        holders = sorted({seen[t, kb] for kb in range(nb)})
        assert holders == list(range(_owner(t * h, units, ctas), _owner((t + 1) * h - 1, units, ctas) + 1))
        for q in holders if len(holders) > 1 else []:  # a shared tile is its holders' first or last
            assert t in (runs[q][0][0], runs[q][-1][0])
            first_tile = (q * units // ctas) // h  # `_slot`: 2q for its run's first tile, 2q + 1 for its last
            assert (t != first_tile) == (t == runs[q][-1][0] and len(runs[q]) > 1)


def test_without_the_taken_wait_a_partial_is_overwritten():
    """Two-block tiles: the second warpgroup reaches its next tile's end while the first still works on the last —
    it writes over a partial not yet taken, or the phases run out of step and a schedule hangs."""
    wrong, hangs = [], 0
    for seed in range(300):
        try:
            wrong += _run(6, shares(4, 2, 1)[0], seed, wait_taken=False)
        except _Hang:
            hangs += 1
    assert any("written over" in w for w in wrong) or hangs


def test_host_refuses_what_the_persistent_kernel_does_not_run():
    """8-bit codes (a 64-K block, one x slice) and K of one 128-K block (a warpgroup would own no block of a tile):
    a clear error before any launch; the ring's slots leave room for the partial products' own buffer."""
    import torch

    from anybit import quantize
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_rs import rs_stages
    from anybit.kernels.frag_rsp import gemm_frag_rsp, rsp_stages

    for text, k, why in [("w8a16", 256, "8-bit"), ("w4a16", 128, "K > 128")]:
        tw = to_triton_layout(quantize(torch.randn(64, k), text))
        with pytest.raises(ValueError, match=why):
            gemm_frag_rsp(torch.randn(4, k).half(), tw)
    assert [rsp_stages(bm) for bm in (32, 64, 128, 256)] == [6, 6, 5, 2]
    assert all(rsp_stages(bm) <= rs_stages(bm) for bm in (32, 64, 128, 192, 256))
