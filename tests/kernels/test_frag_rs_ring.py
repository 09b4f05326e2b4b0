"""A model of the register-operand kernel's ring (`frag_rs_kernel`: one TMA loader, two MMA warpgroups taking
alternate blocks, mbarriers waited by phase parity) run under random schedules: which block's words a warpgroup
reads for each of its blocks. Unguarded with 3 slots it reads a slot's previous block (what the H200 showed,
`frag_rs.RS_MIN_STAGES`); with the kernel's guard, or 4 slots and more, never."""

import random

import pytest


class _Hang(Exception):
    """No actor can move and no copy is in flight."""


class _Barrier:
    """An mbarrier's phase: `wait(parity)` passes once the phase of that parity has completed, i.e. while the current
    phase's parity differs (a fresh barrier passes parity 1)."""

    def __init__(self):
        self.completed = 0

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity


def _loader(stages, blocks, empty, issued):
    for b in range(blocks):
        s = b % stages
        yield lambda s=s, b=b: empty[s].passes(((b // stages) & 1) ^ 1)
        issued.append(b)  # words and x of block b into slot s: they land later (`_land`)


def _warpgroup(me, stages, blocks, ready, empty, slot, guard, ahead, reads):
    """`_consumer_loop`'s order: the first block's words read ahead, then per block: (the block's words), its x, the
    wgmma, the next block's words read ahead, the wait, the release. A read records the block the slot holds."""

    def read(b):
        s = b % stages
        if guard:  # `_block_words` with 3 slots: the release of the slot's previous block first
            yield lambda: empty[s].passes(((b // stages) & 1) ^ 1)
        yield lambda: ready[s].passes((b // stages) & 1)
        reads.append((b, slot[s]))

    mine = list(range(me, blocks, 2))
    if not mine:
        return
    if ahead:
        yield from read(mine[0])
    for i, b in enumerate(mine):
        if not ahead:
            yield from read(b)
        yield lambda b=b: ready[b % stages].passes((b // stages) & 1)  # x's barrier lands with the words here
        if ahead:
            yield from read(mine[min(i + 1, len(mine) - 1)])
        empty[b % stages].completed += 1


def _run(stages, blocks, guard, ahead, seed):
    rng = random.Random(seed)
    ready = [_Barrier() for _ in range(stages)]
    empty = [_Barrier() for _ in range(stages)]
    slot = [None] * stages
    issued, reads = [], []
    actors = [_loader(stages, blocks, empty, issued)]
    actors += [_warpgroup(me, stages, blocks, ready, empty, slot, guard, ahead, reads) for me in (0, 1)]
    waits = {id(a): (lambda: True) for a in actors}
    while actors or issued:
        runnable = [a for a in actors if waits[id(a)]()]
        landing = ["land"] if issued else []
        if not runnable and not landing:
            raise _Hang(f"stages={stages} guard={guard} ahead={ahead} seed={seed}")
        pick = rng.choice(runnable + landing * rng.randint(1, 3))  # copies land late or early
        if pick == "land":
            b = issued.pop(rng.randrange(len(issued)))  # copies in flight land in any order
            slot[b % stages] = b
            ready[b % stages].completed += 1
            continue
        try:
            waits[id(pick)] = next(pick)
        except StopIteration:
            actors.remove(pick)
    return reads


def _wrong_reads(stages, guard, ahead, blocks=13, runs=300):
    """Reads of another block than the one waited for, over `runs` random schedules (a hang raises)."""
    return sum(got != b for seed in range(runs) for b, got in _run(stages, blocks, guard, ahead, seed))


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "not-ahead"])
def test_three_unguarded_slots_read_a_previous_block(ahead):
    """The hazard the H200 showed: a wait for block b passes on block b - 6's phase while b - 3 is in flight — a
    wrong block read, and in some schedules a hang (the early releases that follow run the phases out of step)."""
    wrong = 0
    for seed in range(1000):
        try:
            wrong += sum(got != b for b, got in _run(3, 13, False, ahead, seed))
        except _Hang:  # the hazard too
            continue
    assert wrong > 0


@pytest.mark.parametrize("stages, guard", [(3, True), (4, False), (5, False), (6, False)])
@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "not-ahead"])
@pytest.mark.parametrize("blocks", [1, 2, 5, 13])
def test_the_kernel_reads_only_its_own_blocks(stages, guard, ahead, blocks):
    """The kernel as built: the guard with 3 slots (`frag_rs_kernel._block_words`), none from 4 slots on — every read
    is the block it waited for, and no schedule hangs (a single block: the second warpgroup has none)."""
    assert _wrong_reads(stages, guard, ahead, blocks) == 0
