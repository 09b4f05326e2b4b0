"""moe_align inside a CUDA graph: fixed output sizes, no host synchronisation (device only)."""

import pytest
import torch

from anybit.moe import moe_align
from tests.moe.test_routing_align import align_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "t, e, dtype", [(300, 64, torch.int32), (1, 256, torch.int32), (16, 256, torch.int32), (4096, 256, torch.int64)]
)  # chunked; decode's one launch; torch.topk's int64 ids read as they are
def test_align_captures_and_replays(t, e, dtype):
    ids = torch.randint(0, e, (t, 8), device="cuda", dtype=dtype)
    moe_align(ids, e, 16, check=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_align(ids, e, 16, check=True)  # the id check (a device-side assert) captures too
    for seed in range(3):
        ids.copy_(torch.randint(0, e, (t, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        r_ids, r_blocks, r_total = align_reference(ids.cpu(), e, 16)
        assert out[0].tolist() == r_ids and out[1].tolist() == r_blocks and int(out[2]) == r_total
