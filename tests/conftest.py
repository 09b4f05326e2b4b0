import os
import sys
import zlib

import pytest
import torch


def pytest_configure(config):
    """RECORD_COMPILES=<file> (tools/device.sh sets it on the device): every kernel compile of the run is appended
    to it, for tools/compile_cache.py to compile on the CPU machine into a cache the next device call carries."""
    if os.environ.get("RECORD_COMPILES"):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
        from compile_cache import record_from_env

        record_from_env()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded(request):
    """torch's global generator seeded by the test's own id: a test draws the same random inputs whatever ran before
    it (a failure reproduces alone; an unseeded MXFP4 spread case once failed only after new tests moved the state),
    and different tests draw different ones."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def interpret():
    """Triton kernels on the CPU need TRITON_INTERPRET=1 set before triton is imported (CI sets it)."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")


@pytest.fixture
def fake_hopper(monkeypatch):
    """The Triton backend's route decisions as on an H200: Gluon's Hopper kernels available, 132 SMs (no launch)."""
    import anybit.backends.triton as triton_backend
    import anybit.kernels.frag_rs as frag_rs
    import anybit.kernels.frag_ws as frag_ws

    monkeypatch.setattr(frag_ws, "gluon_hopper_why_not", lambda device: None)
    monkeypatch.setattr(frag_rs, "gluon_hopper_why_not", lambda device: None)
    monkeypatch.setattr(triton_backend, "_sm_count", lambda device: 132)
