"""Run a module as `python -m` does, with this process's kernel compiles recorded where RECORD_COMPILES names a file
(`compile_cache.record_from_env`): tools/device.sh runs the anybit CLI's bench and tune parts through it.

    python tools/recorded.py anybit.cli bench [args…]
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(__file__))

from compile_cache import record_from_env  # noqa: E402

record_from_env()
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
