"""tools/compile_cache.py: a specialisation recorded on the device replays here with this machine's libdevice."""

import json
import os
import sys

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

from compile_cache import _local_libs  # noqa: E402


def test_a_recorded_libdevice_path_becomes_this_machines():
    device = "/opt/torch/.venv/lib/python3.12/site-packages/triton/backends/nvidia/lib/libdevice.10.bc"
    data = json.dumps({"name": "k", "options": {"num_warps": 4, "extern_libs": [["libdevice", device]]}})
    spec = json.loads(_local_libs(data))
    name, path = spec["options"]["extern_libs"][0]
    assert name == "libdevice" and os.path.exists(path)
    assert path.startswith(os.path.dirname(triton.__file__)) and spec["options"]["num_warps"] == 4


def test_paths_that_exist_and_specialisations_without_libraries_stay():
    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "lib", "libdevice.10.bc")
    for options in ({"extern_libs": [["libdevice", here]]}, {"extern_libs": None}, {}):
        data = json.dumps({"name": "k", "options": options})
        assert json.loads(_local_libs(data)) == json.loads(data)
