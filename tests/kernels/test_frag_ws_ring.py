"""A model of the warp-specialised kernel's ring of decoded slices (`frag_ws_kernel`: NDEC decoder partitions taking
alternate blocks of `steps` 64-K steps each and handing them over two at a time, the MMA partition taking the steps
in order with one wgmma in flight, mbarriers waited by phase parity) run under random schedules. With two decoders
and no more stages than a block has steps, a decoder's wait for a slot passes on the release a whole ring earlier and
it rewrites a slice no wgmma has read yet (the H200 hung: 2-bit codes, 3 stages, session 36); one decoder handing
over two steps at a time hangs with 2 stages; from `frag_ws.ws_min_stages` (which `gemm_frag_ws` enforces) never.
Keep it in step with `_w_decoder`, `_int_block` / `_put` / `_stage` / `_hand_over` and `_mma_loop`."""

import random

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels.frag_ws import gemm_frag_ws, ws_block_steps, ws_min_stages


class _Barrier:
    """An mbarrier's phase: `passes(parity)` once the phase of that parity has completed (a fresh one passes 1)."""

    def __init__(self):
        self.completed = 0

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity


class _Ring:
    def __init__(self, stages: int):
        self.stages = stages
        self.ready, self.empty = [_Barrier() for _ in range(stages)], [_Barrier() for _ in range(stages)]
        self.slot: list = [None] * stages  # the step a slot holds until its release
        self.wrong: list[str] = []

    def release(self, j: int):
        self.slot[j % self.stages] = None
        self.empty[j % self.stages].completed += 1


def _decoder(ring: _Ring, part: int, ndec: int, blocks: int, steps: int):
    n = ring.stages
    for b in range(part, blocks, ndec):
        for t in range(steps):
            j = b * steps + t
            yield lambda j=j: ring.empty[j % n].passes(((j // n) & 1) ^ 1)
            if ring.slot[j % n] is not None:
                ring.wrong.append(f"step {j} rewrote step {ring.slot[j % n]}, not yet released")
            ring.slot[j % n] = j
            if steps == 1 or t % 2:  # `_put` hands each step over, `_hand_over` two
                for i in range(j - min(steps, 2) + 1, j + 1):
                    ring.ready[i % n].completed += 1


def _mma(ring: _Ring, num_k: int):
    n = ring.stages
    for j in range(num_k):
        yield lambda j=j: ring.ready[j % n].passes((j // n) & 1)
        if ring.slot[j % n] != j:
            ring.wrong.append(f"the wgmma of step {j} read step {ring.slot[j % n]}")
        if j:
            ring.release(j - 1)  # the previous wgmma retired once this one is issued
    ring.release(num_k - 1)


def _run(stages: int, ndec: int, steps: int, blocks: int, rng: random.Random) -> list[str]:
    """One random schedule; what went wrong ("hang" where no actor can move)."""
    ring = _Ring(stages)
    actors = [_mma(ring, blocks * steps)] + [_decoder(ring, p, ndec, blocks, steps) for p in range(ndec)]
    waits = [next(a) for a in actors]
    while actors:
        movable = [i for i, w in enumerate(waits) if w()]
        if not movable:
            return ring.wrong + ["hang"]
        i = rng.choice(movable)
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            del actors[i], waits[i]
    return ring.wrong


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("ndec", [1, 2])
@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6])
def test_the_ring_is_safe_from_the_fewest_stages_allowed(bits, ndec, stages):
    """300 random schedules of 7 blocks: nothing goes wrong exactly from `ws_min_stages` on (blocks of 1 K step: 8-bit
    codes, 2: 4- and 3-bit codes and e2m1, 4: 2-bit codes)."""
    steps = ws_block_steps(bits)
    rng = random.Random(bits * 100 + ndec * 10 + stages)
    found = [w for _ in range(300) for w in _run(stages, ndec, steps, 7, rng)]
    assert (not found) == (stages >= ws_min_stages(bits, ndec)), found[:3]


def test_two_decoders_with_too_few_stages_are_refused():
    """`gemm_frag_ws` refuses the tile before any launch, naming what would be valid."""
    tw = to_triton_layout(quantize(torch.randn(128, 512) * 0.05, "w2a16"))
    x = torch.randn(256, 512, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"ndec=2 with 2-bit codes needs stages >= 5, got stages=3"):
        gemm_frag_ws(x, tw, block_m=256, ndec=2, stages=3, depth=2)


# (bits, plain): the kernel's own weights (4-bit integers and e2m1, 8-bit integers), and those only its row-major tiles
# take (`frag_rs.ws_int_why_not`: 2- and 3-bit codes, zero points, other-dtype scales)
@pytest.mark.parametrize("bits, plain", [(4, False), (8, False), (2, True), (3, True), (4, True), (8, True)])
def test_every_tile_the_route_gives_has_the_stages_it_needs(bits, plain):
    """`ws_route_tile`'s warp-specialised tiles (swapped, row-major, two decoders) over the shapes and rows it routes
    keep `ws_min_stages` (the kernel's default stages where a tile names none)."""
    import inspect

    from anybit.backends.triton import ws_route_tile

    default = inspect.signature(gemm_frag_ws).parameters["stages"].default
    shapes = [(4096, 4096), (6144, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (1008, 2944), (28672, 4096)]
    for n, k in shapes:
        for m in (65, 96, 128, 160, 192, 256, 300, 384, 512, 768, 1024):
            tile = ws_route_tile(m, n, k, 132, bits, ws=not plain, plain=plain)
            if tile is None or tile.get("rs"):
                continue
            stages, ndec = tile.get("stages", default), tile.get("ndec", 1)
            assert stages >= ws_min_stages(bits, ndec), (n, k, m, tile)
