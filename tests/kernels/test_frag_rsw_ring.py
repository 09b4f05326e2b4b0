"""A model of the wide persistent register-operand kernel's rings (`frag_rsw_kernel`, work in progress) under random
schedules, the copies landing in any order: a TMA loader filling, per block g of the CTA's run, the word slots
2 (g % S) + q of both panels (a barrier each) and the stage's x slot once both warpgroups released the stage (one
barrier of two arrivals); two MMA warpgroups each reading every block — its panel's words read one block ahead, the
x waited for, the wgmma, its wait, the release. Checks that each warpgroup reads block g's own words and x for every
g, that no copy lands in a stage a wgmma still reads, and that with one stage the schedule hangs (the words read
ahead need a second). Keep it in step with `_w_loader` and `_w_mma`."""

import random

import pytest

from tests.kernels.test_frag_rs_ring import _Barrier, _Hang, _schedule


class _Stage2(_Barrier):
    """A barrier of two arrivals: a phase completes every second one."""

    def __init__(self):
        super().__init__()
        self.arrivals = 0

    def arrive(self):
        self.arrivals += 1
        self.completed = self.arrivals // 2


class _WideRing:
    def __init__(self, stages: int):
        self.stages = stages
        self.ready = [_Barrier() for _ in range(2 * stages)]  # panel slots 2s + q
        self.x_ready = [_Barrier() for _ in range(stages)]  # (the kernel's two x halves share one fate)
        self.empty = [_Stage2() for _ in range(stages)]
        self.words = [None] * (2 * stages)
        self.x = [None] * stages
        self.reading = [set() for _ in range(stages)]
        self.in_flight, self.wrong = [], []

    def land(self, kind: str, slot: int, g: int):
        if kind == "words":
            self.words[slot] = g
            self.ready[slot].completed += 1
            return
        if self.reading[slot]:
            self.wrong.append(f"x of block {g} landed under warpgroups {self.reading[slot]}'s wgmma")
        self.x[slot] = g
        self.x_ready[slot].completed += 1


def _loader(ring: _WideRing, blocks: int):
    S = ring.stages
    for g in range(blocks):
        s = g % S
        yield lambda s=s, g=g: ring.empty[s].passes(((g // S) & 1) ^ 1)
        ring.in_flight += [("words", 2 * s, g), ("words", 2 * s + 1, g), ("x", s, g)]


def _warpgroup(ring: _WideRing, me: int, blocks: int):
    S = ring.stages

    def read(g):  # `_block_words(2g + me)` on a ring of 2S panel slots
        b = 2 * g + me
        yield lambda: ring.ready[b % (2 * S)].passes((b // (2 * S)) & 1)
        if ring.words[b % (2 * S)] != g:
            ring.wrong.append(f"warpgroup {me} read block {ring.words[b % (2 * S)]}'s words as block {g}'s")

    yield from read(0)
    for g in range(blocks):
        s = g % S
        yield lambda g=g, s=s: ring.x_ready[s].passes((g // S) & 1)
        if ring.x[s] != g:
            ring.wrong.append(f"warpgroup {me}'s wgmma read block {ring.x[s]}'s x as block {g}'s")
        ring.reading[s].add(me)
        yield from read(min(g + 1, blocks - 1))
        yield lambda: True  # the wgmma's wait
        ring.reading[s].discard(me)
        ring.empty[s].arrive()


def _run(stages: int, blocks: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ring = _WideRing(stages)
    actors = [_loader(ring, blocks), _warpgroup(ring, 0, blocks), _warpgroup(ring, 1, blocks)]
    return _schedule(ring, actors, rng, f"stages={stages} blocks={blocks} seed={seed}")


@pytest.mark.parametrize("stages", [2, 3, 5, 6])
@pytest.mark.parametrize("blocks", [1, 2, 7, 20])
def test_each_warpgroup_reads_every_block_of_its_own(stages, blocks):
    for seed in range(100):
        assert _run(stages, blocks, seed) == [], seed


def test_one_stage_hangs():
    """The next block's words are read before the block is released: with one stage they never come."""
    with pytest.raises(_Hang):
        _run(1, 3, 0)


def test_host_refuses_eight_bit_codes_and_sizes_its_stages():
    import torch

    from anybit import quantize
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_rsp import gemm_frag_rsw, rsw_stages, shares

    tw = to_triton_layout(quantize(torch.randn(128, 256), "w8a16"))
    with pytest.raises(ValueError, match="8-bit"):
        gemm_frag_rsw(torch.randn(4, 256).half(), tw)
    tw = to_triton_layout(quantize(torch.randn(128, 256), "w4a16"))
    with pytest.raises(ValueError, match="block_m=256"):
        gemm_frag_rsw(torch.randn(4, 256).half(), tw, block_m=256)
    assert [rsw_stages(bm) for bm in (48, 64, 96, 128, 192, 256)] == [8, 8, 6, 5, 3, 3]
    assert [rsw_stages(bm, panels=4) for bm in (64, 96)] == [6, 5]  # (four panels' words a stage)
    with pytest.raises(ValueError, match="panels=3"):
        gemm_frag_rsw(torch.randn(4, 256).half(), tw, panels=3)
    with pytest.raises(
        ValueError, match=r"times: an int64 buffer of >= 40 x 2 CTAs = 80 stamps, got torch.int32 x 160"
    ):
        gemm_frag_rsw(
            torch.randn(4, 256).half(), tw, ctas=4, times=torch.zeros(160, dtype=torch.int32)
        )  # (2 blocks: 2 CTAs)
    runs = shares(5, 7, 4, pairs=False)  # one block a unit: 35 blocks in runs of 8 or 9, split anywhere
    assert [sum(hi - lo for _, lo, hi in run) for run in runs] == [8, 9, 9, 9]
    assert sorted((t, kb) for run in runs for t, lo, hi in run for kb in range(lo, hi)) == [
        (t, kb) for t in range(5) for kb in range(7)
    ]


def test_the_route_sends_tall_weights_one_tile_calls_to_the_wide_kernel(monkeypatch):
    """`rsw_tile`: 2-4-bit codes at 33-192 rows of weights whose 64-row tiles overfill a wave and whose K blocks give
    each CTA 96 at least; the route runs it where it would run a one-tile, unsplit `rs_tile` tile and at 129-192 rows
    (4-bit W4A16 at 65-192 rows of 28672x8192, 3-bit codes with zero points from 33 rows), with the same tokens; 8-bit
    codes, shorter weights or K, other row counts, the frag kernel's decode (4-bit at 64 rows) and ANYBIT_RS_WIDE=0
    keep their route; the backend's `_rs_gemm` runs `gemm_frag_rsw` on a wide tile only."""
    import torch

    from anybit import quantize
    from anybit.backends import triton as backend
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_rs import rs_block_m
    from anybit.kernels.frag_rsp import rsw_tile

    for m in (33, 64, 96, 128, 160, 192):
        assert rsw_tile(m, 28672, 8192) == dict(rs=True, wide=True, block_m=rs_block_m(m, 28672)), m
        assert backend.ws_route_tile(m, 28672, 8192, 132, 3, ws=False) == rsw_tile(m, 28672, 8192, bits=3), m
        wide = (backend.ws_route_tile(m, 28672, 8192, 132, 4) or {}).get("wide", False)
        assert wide == (64 < m <= 192), m
    for args in [(32, 28672, 8192, 132, 4), (193, 28672, 8192, 132, 4), (96, 8448, 8192, 132, 4),
                 (96, 8192, 8192, 132, 4), (96, 28672, 8192, 132, 8), (96, 14336, 4096, 132, 4)]:  # fmt: skip
        assert rsw_tile(*args) is None, args
        assert not (backend.ws_route_tile(*args) or {}).get("wide"), args
    assert rsw_tile(96, 16896, 8192, 80) is not None  # (the SMs decide: 264 tiles overfill 80 SMs, 105 blocks each)
    monkeypatch.setenv("ANYBIT_RS_WIDE", "0")
    assert not (backend.ws_route_tile(96, 28672, 8192, 132, 4) or {}).get("wide")
    calls = []
    monkeypatch.setattr(backend, "gemm_frag_rsw", lambda x, tw, bias, **kw: calls.append(("rsw", kw["block_m"])))
    monkeypatch.setattr(backend, "gemm_frag_rs", lambda x, tw, bias, **kw: calls.append(("rs", kw["block_m"])))
    x, w4 = torch.randn(4, 256).half(), to_triton_layout(quantize(torch.randn(128, 256), "w4a16"))
    backend._rs_gemm(x, w4, None, None, {"rs": True, "block_m": 96})
    backend._rs_gemm(x, w4, None, None, {"rs": True, "wide": True, "block_m": 160})
    assert calls == [("rs", 96), ("rsw", 160)]
