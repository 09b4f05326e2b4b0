"""A model of the persistent register-operand kernel's rings (`frag_rsp_kernel`, work in progress) under random
schedules, on `test_frag_rs_ring`'s ring: a CTA's tiles as one run of blocks g = t * nb + b, owned by parity, the
words read ahead across tiles, and at each warpgroup's last block of a tile the hand-over of the second's partial
products through their own buffer (`red_bar[0]`: landed, `red_bar[1]`: taken). Checks that every block's words and x
are the ones waited for, that each tile's y sums each of its blocks once, and that a partial is never overwritten
before it is taken — and that without the wait for `red_bar[1]` one is. Keep it in step with `_p_mma`, `_p_loader`."""

import random

import pytest

from tests.kernels.test_frag_rs_ring import _Barrier, _Hang, _loader, _Ring, _schedule


class _Red:
    def __init__(self):
        self.full, self.empty = _Barrier(), _Barrier()
        self.holding = None  # (tile, its blocks) in the buffer


def _warpgroup(ring: _Ring, red: _Red, me: int, tiles: int, nb: int, guard: bool, wait_taken: bool):
    stages = ring.stages

    def read(g):
        s = g % stages
        if guard:
            yield lambda: ring.empty[s].passes(((g // stages) & 1) ^ 1)
        yield lambda: ring.ready[s].passes((g // stages) & 1)
        if ring.words[s] != g:
            ring.wrong.append(f"warpgroup {me} read block {ring.words[s]}'s words as block {g}'s")

    mine = list(range(me, tiles * nb, 2))
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
        t = g // nb
        if (g + 2) // nb == t:
            continue
        if me == 1:  # the partial into the buffer once the previous one is taken
            if wait_taken:
                yield lambda t=t: red.empty.passes((t & 1) ^ 1)
            if red.holding is not None:
                ring.wrong.append(f"tile {t}'s partial written over tile {red.holding[0]}'s")
            red.holding = (t, acc)
            red.full.completed += 1
        else:
            yield lambda t=t: red.full.passes(t & 1)
            if red.holding is None or red.holding[0] != t:
                ring.wrong.append(f"tile {t} took {red.holding and red.holding[0]}'s partial")
            elif sorted(acc + red.holding[1]) != list(range(t * nb, (t + 1) * nb)):
                ring.wrong.append(f"tile {t} summed blocks {sorted(acc + red.holding[1])}")
            red.holding = None
            red.empty.completed += 1
        acc = []


def _run(stages: int, tiles: int, nb: int, seed: int, wait_taken: bool = True) -> list[str]:
    rng = random.Random(seed)
    ring, red = _Ring(stages), _Red()
    guard = stages % 2 == 1
    actors = [_loader(ring, tiles * nb)] + [_warpgroup(ring, red, me, tiles, nb, guard, wait_taken) for me in (0, 1)]
    return _schedule(ring, actors, rng, f"stages={stages} tiles={tiles} nb={nb} seed={seed}")


@pytest.mark.parametrize("stages", [3, 4, 5, 6])
@pytest.mark.parametrize("tiles, nb", [(1, 2), (3, 2), (2, 3), (4, 3), (3, 5), (2, 8)])
def test_each_tile_sums_its_blocks_once_and_reads_only_its_own(stages, tiles, nb):
    for seed in range(200):
        assert _run(stages, tiles, nb, seed) == [], seed


def test_without_the_taken_wait_a_partial_is_overwritten():
    """Two-block tiles: the second warpgroup reaches its next tile's end while the first still works on the last —
    it writes over a partial not yet taken, or the phases run out of step and a schedule hangs."""
    wrong, hangs = [], 0
    for seed in range(300):
        try:
            wrong += _run(6, 4, 2, seed, wait_taken=False)
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
