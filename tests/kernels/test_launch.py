"""`Launcher`: a compiled kernel launched past `JITFunction.run` once a call of the same specialisation compiled it
(a stand-in JIT function and driver here; the GPU tests launch the real kernels both ways, bit for bit)."""

from __future__ import annotations

import types

import pytest
import torch
from triton.runtime.driver import driver

from anybit.kernels.launch import Launcher


class _Kernel:
    """What `JITFunction.run` returns: a compiled kernel whose launcher records its calls."""

    def __init__(self, calls):
        self.packed_metadata, self.function, self.calls = "meta", "fn", calls

    def run(self, *a):
        self.calls.append(("fast", a))


class _Jit:
    """A JIT function of parameters (x, m, y, BLOCK: constexpr, FLAG: constexpr = 7): `fn[grid](...)` records the
    call and returns a compiled kernel (or, `compiled` False, is the interpreter's function: returns None)."""

    def __init__(self, compiled=True):
        if compiled:
            self.device_caches, self.pre_run_hooks = {}, []

        def kernel(x, m, y, BLOCK, FLAG=7):
            pass

        self.signature, self.__name__ = types.SimpleNamespace(parameters=_params(kernel)), "kernel"
        self.calls, self.compiled = [], compiled

    def __getitem__(self, grid):
        def run(*args, **consts):
            self.calls.append(("jit", grid, args, consts))
            return _Kernel(self.calls) if self.compiled else None

        return run


def _params(fn):
    import inspect

    return inspect.signature(fn).parameters


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def stand_in_driver():
    saved = driver._active
    driver.set_active(_Driver())
    yield
    driver._active = saved


def test_a_launch_of_a_seen_specialisation_skips_the_jit(stand_in_driver):
    fn = _Jit()
    launch = Launcher(fn, dict(BLOCK=64, num_warps=4), live=(0, 1, 2))
    x, y = torch.randn(64), torch.empty(64)
    launch((3,), x, 32, y)
    launch((5, 2), x, 48, y)  # M another multiple of 16: the same kernel
    assert [c[0] for c in fn.calls] == ["jit", "fast"]
    assert fn.calls[1][1] == (5, 2, 1, 1234, "fn", "meta", None, None, None, x, 48, y, 64, 7)  # BLOCK, FLAG's default


@pytest.mark.parametrize("other", ["m_one", "m_odd", "misaligned", "dtype"])
def test_a_new_specialisation_of_a_live_argument_compiles_through_the_jit(stand_in_driver, other):
    fn = _Jit()
    launch = Launcher(fn, dict(BLOCK=64), live=(0, 1, 2))
    x, y = torch.randn(64), torch.empty(64)
    launch((1,), x, 32, y)
    args = dict(m_one=(x, 1, y), m_odd=(x, 33, y), misaligned=(x[1:], 32, y), dtype=(x.half(), 32, y))[other]
    launch((1,), *args)
    launch((1,), *args)
    assert [c[0] for c in fn.calls] == ["jit", "jit", "fast"]


def test_the_interpreter_and_the_switch_take_the_jit_every_call(stand_in_driver, monkeypatch):
    fn = _Jit(compiled=False)  # the interpreter's run returns no compiled kernel
    launch = Launcher(fn, dict(BLOCK=64), live=(0,))
    x = torch.randn(64)
    for _ in range(3):
        launch((1,), x, 32, x)
    fn2 = _Jit()
    monkeypatch.setenv("ANYBIT_FAST_LAUNCH", "0")
    launch2 = Launcher(fn2, dict(BLOCK=64), live=(0,))
    for _ in range(3):
        launch2((1,), x, 32, x)
    assert [c[0] for c in fn.calls] == ["jit"] * 3 and [c[0] for c in fn2.calls] == ["jit"] * 3


def test_a_parameter_without_a_value_is_named(stand_in_driver):
    launch = Launcher(_Jit(), {}, live=(0,))
    with pytest.raises(TypeError, match=r"no value for parameters \['BLOCK'\]"):
        launch((1,), torch.randn(4), 32, torch.empty(4))


def test_a_profiler_hook_takes_the_jit(stand_in_driver):
    """A launch hook (Proton, the Triton profiler) wants the launch metadata `JITFunction.run` works out."""
    from triton import knobs

    fn = _Jit()
    launch = Launcher(fn, dict(BLOCK=64), live=(0,))
    x = torch.randn(64)
    launch((1,), x, 32, x)

    def hook(metadata):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch((1,), x, 32, x)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    launch((1,), x, 32, x)
    assert [c[0] for c in fn.calls] == ["jit", "jit", "fast"]


def test_another_argument_count_takes_the_jit(stand_in_driver):
    """The parameters after the positional ones are bound once, for the first call's count: a call passing another
    count (no call site does) goes through the JIT and is not remembered."""
    fn = _Jit()
    launch = Launcher(fn, dict(BLOCK=64, FLAG=3), live=(0,))
    x = torch.randn(64)
    launch((1,), x, 32, x)
    launch((1,), x, 32, x, 64)  # BLOCK positional, FLAG from consts
    launch((1,), x, 32, x, 64)
    launch((1,), x, 32, x)
    assert [c[0] for c in fn.calls] == ["jit", "jit", "jit", "fast"]
    assert fn.calls[-1][1][-5:] == (x, 32, x, 64, 3)


def test_a_pre_run_hook_takes_the_jit(stand_in_driver):
    """`JITFunction.add_pre_run_hook` hooks run in Triton's path only: a kernel that has one always takes it."""
    fn = _Jit()
    launch = Launcher(fn, dict(BLOCK=64), live=(0,))
    x = torch.randn(64)
    launch((1,), x, 32, x)
    fn.pre_run_hooks.append(lambda *a, **k: None)
    launch((1,), x, 32, x)
    assert [c[0] for c in fn.calls] == ["jit", "jit"]
