"""Launching compiled Triton and Gluon kernels without `JITFunction.run`'s per-call work.

`kernel[grid](*args, **consts)` costs 30-60 µs of host time on the H200's host for our ~20-45-argument kernels (session
24, `tools/probe_host_layers.py`): Triton binds and specialises every argument (alignment of each pointer, each int
== 1 or a multiple of 16, a descriptor's layout by its repr), hashes that into a cache key and looks the compiled
kernel up, every call. An eager call of a small layer at 256-1024 rows is host-bound by it. A `Launcher` holds one
call site's constexprs (fixed for the launcher's life) and remembers the compiled kernel per specialisation of the
arguments that change between its calls (`live`: x, y, M, bias …); a call whose specialisation it has seen goes
straight into the kernel's compiled launcher (`CompiledKernel.run`, what `JITFunction.run` itself ends in). The
first call of each specialisation, the CPU interpreter, a set launch hook (profilers) and ANYBIT_FAST_LAUNCH=0 take
`JITFunction.run`.

The contract: every argument not in `live` is the same value, or a tensor with the same alignment and dtype, at every
call of one launcher — keep launchers on the weight they launch (`TritonWeight.launches`) and key them by whatever
picks their constexprs. ANYBIT_LAUNCH_CHECK=1 (the tests) specialises every argument as Triton does at every fast
call and raises where one differs from the remembered kernel's.
"""

from __future__ import annotations

import operator

import torch
from triton import knobs
from triton.runtime.driver import driver

from anybit import settings


class Launcher:
    """`fn[grid](*args, **consts)` for one call site's constexprs and launch options `consts`; `live`: the indices of
    the positional arguments that may change their specialisation between calls (pointers, ints)."""

    __slots__ = ("fn", "consts", "live", "pick", "tail", "given", "kernels", "compiles")

    def __init__(self, fn, consts: dict, live: tuple[int, ...]):
        self.fn, self.consts, self.live = fn, consts, live
        self.pick = (lambda args: (args[live[0]],)) if len(live) == 1 else operator.itemgetter(*live)
        self.compiles = hasattr(fn, "device_caches")  # a JITFunction (the CPU interpreter's function is not)
        self.tail: tuple | None = None  # the parameters after the positional ones, in order (known at the first call)
        self.given = -1  # how many positional arguments the tail follows
        self.kernels: dict = {}  # (device, specialisation of the live arguments) -> compiled kernel

    def __call__(self, grid: tuple, *args):
        if not (self.compiles and settings.fast_launch()):
            return self.fn[grid](*args, **self.consts)
        if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook) or self.fn.pre_run_hooks:
            return self.fn[grid](*args, **self.consts)  # profilers' and others' hooks: Triton's path runs them
        device = driver.active.get_current_device()
        key = (device, *map(_spec, self.pick(args)))
        kernel = self.kernels.get(key)
        if kernel is None or len(args) != self.given:  # (a call site passes one argument list: a guard, not a path)
            kernel = self.fn[grid](*args, **self.consts)
            if hasattr(kernel, "packed_metadata") and self.given in (-1, len(args)):  # a compiled kernel
                if self.tail is None:
                    self.tail, self.given = self._tail(len(args)), len(args)
                self.kernels[key] = kernel
                if _CHECK:
                    self.kernels["check", key] = self._specialise(args)
            return kernel
        if _CHECK:
            self._check(self.kernels["check", key], args)
        stream = driver.active.get_current_stream(device)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args,
                   *self.tail)  # fmt: skip
        return kernel

    def _tail(self, given: int) -> tuple:
        """The values `JITFunction.run` binds to the parameters after the `given` positional ones: `consts`' or the
        parameter's default."""
        params = list(self.fn.signature.parameters.values())[given:]
        missing = [p.name for p in params if p.name not in self.consts and p.default is p.empty]
        if missing:
            raise TypeError(f"{self.fn.__name__}: no value for parameters {missing}")
        return tuple(self.consts.get(p.name, p.default) for p in params)

    def _specialise(self, args: tuple) -> list:
        """Triton's specialisation of each positional argument (its binder's, `native_specialize_impl`)."""
        from triton._C.libtriton import native_specialize_impl

        backend = self.fn.device_caches[driver.active.get_current_device()][3]
        return [native_specialize_impl(backend, a, False, True, True) for a in args]

    def _check(self, first: list, args: tuple) -> None:
        """Raise where Triton would specialise this call's arguments otherwise than the compiling call's (`first`)."""
        now = self._specialise(args)
        diff = [i for i, (a, b) in enumerate(zip(first, now, strict=True)) if a != b]
        if diff:
            raise AssertionError(
                f"{self.fn.__name__}: arguments {diff} specialise otherwise than at the compiling "
                f"call ({[first[i] for i in diff]} -> {[now[i] for i in diff]}); live={self.live}"
            )


_CHECK = settings.launch_check()


def _hooked(hook) -> bool:
    """Whether a Triton launch hook does anything (Triton 3.6+: a `HookChain`, empty unless a profiler added one)."""
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


def _spec(arg) -> object:
    """What Triton specialises a live argument on: a tensor's dtype and 16-byte alignment, an int's being 1, a
    multiple of 16, or beyond 32 bits; anything else (None, descriptors of a fixed layout) not at all."""
    kind = type(arg)
    if kind is not int and (kind is torch.Tensor or isinstance(arg, torch.Tensor)):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, int):  # (bools too)
        return arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31
    return None
