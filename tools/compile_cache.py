"""Record the Triton / Gluon kernels a GPU call compiles, and compile them again on this CPU machine for sm_90a into
a cache directory that the next device call carries, so that the device loads them instead of compiling (the Gluon
compiles are most of a GPU test call's time: a 100-test file outran 300 s).

On the device (tools/device.sh sets it): RECORD_COMPILES=$OUT/compiles.jsonl makes tests/conftest.py, the probes
(`probe_out`) and `tools/recorded.py` append a line per compile — the kernel and Triton's own specialization data
(`jit_cache_hook`). Here:

    PYTHONPATH=. /tmp/v312/bin/python tools/compile_cache.py /work/.device/N/compiles.jsonl [--cache .tcache] [--keep]

compiles each recorded kernel from this checkout (`JITFunction.preload` through `sm90_check`'s stand-in driver; the
same Triton wheel and Python minor as the device's) and keeps of each new cache entry what a launch reads: the
metadata JSON and the cubin (Triton's group files name absolute paths, and the device runs the repository at the same
path, /work/main). Carry the directory and export TRITON_CACHE_DIR=$PWD/.tcache there (tools/device.sh does where it
is). A kernel whose source changed since the record compiles as it is now: the record names kernels and their
specialisations, not code. Keys do not depend on what a process compiled first (`canonical_keys`). Checked here
(session 36): three recording processes (frag decode kernels in two orders with the grouped MoE kernel, the
warp-specialised Gluon kernel; 8 records, 5 kernels) replayed in one process into the same 5 cache keys; a pruned
entry loads without compiling. The device's first call on a cache of the ws kernel built here (before
`canonical_keys`) took 0.88 s. Not yet run: a whole GPU test file from a replayed cache.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys


def record_from_env() -> None:
    """Where RECORD_COMPILES names a file (tools/device.sh sets it on the device), append one JSON line per kernel
    compile of this process to it (Triton's `jit_cache_hook`), after making the keys canonical; else nothing. A kernel
    whose constexprs do not serialise to JSON is left out rather than failing its launch (Triton serialises them before
    it calls the hook)."""
    path = os.environ.get("RECORD_COMPILES")
    if not path:
        return
    import triton.runtime.jit as jit
    from triton import knobs

    serialise = jit.serialize_specialization_data

    def lenient(*args, **kwargs):
        try:
            return serialise(*args, **kwargs)
        except (TypeError, ValueError):
            return None

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 (Triton's names)
        if compile["specialization_data"] is not None:
            line = json.dumps(dict(module=fn.module, name=fn.name, data=compile["specialization_data"]))
            with open(path, "a") as f:
                f.write(line + "\n")
        return False  # (compile as usual)

    jit.serialize_specialization_data = lenient
    knobs.runtime.jit_cache_hook = hook
    try:
        canonical_keys()
    except Exception as ex:  # a recording run goes on (its keys then depend on the compile order)
        print(f"compile_cache: keys not made canonical: {type(ex).__name__}: {ex}", file=sys.stderr)


def canonical_keys(passes: int = 8) -> int:
    """Give every Triton / Gluon function of `anybit.kernels` the cache key it has whatever the process compiled
    first, before any compile: Triton 3.6 merges a helper's constexpr globals into its caller's key before it hashes
    the helper (`DependenciesFinder._update_hash`), so a key depends on which helpers some earlier kernel hashed.
    Hashing every function again until no key changes (their globals complete by then) removes that. Both the device
    (`record_from_env`) and the replay here do it, so one replay process rebuilds the keys of any number of
    recording processes. Returns the functions keyed."""
    import pkgutil

    from triton.runtime.jit import JITCallable

    import anybit.kernels

    fns = []
    for info in pkgutil.iter_modules(anybit.kernels.__path__):
        mod = importlib.import_module(f"anybit.kernels.{info.name}")
        fns += [v for v in vars(mod).values() if isinstance(v, JITCallable) and v.__module__ == mod.__name__]
    keys = None
    for _ in range(passes):
        for fn in fns:
            fn.hash = None  # (its globals stay: the next pass merges them into its callers)
        now = [fn.cache_key for fn in fns]
        if now == keys:
            break
        keys = now
    return len(fns)


def _kernel(module: str, name: str):
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _local_libs(data: str) -> str:
    """A recorded specialisation with its extern libraries (libdevice) at this machine's Triton: the recording
    machine's paths (the device's Triton lives elsewhere) do not exist here; Triton keys them by their contents."""
    import triton

    spec = json.loads(data)
    libs = spec.get("options", {}).get("extern_libs") or []
    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "lib")
    for lib in libs:
        if not os.path.exists(lib[1]):
            lib[1] = os.path.join(here, os.path.basename(lib[1]))
    return json.dumps(spec)


def replay(lines: list[str], cache: str) -> tuple[int, list[str]]:
    """Compile every distinct recorded kernel into `cache` (absolute) through the stand-in driver, keys made canonical
    first; returns (compiled, what failed)."""
    os.environ["TRITON_CACHE_DIR"] = cache  # (before Triton's first compile reads it)
    sys.path.insert(0, os.path.dirname(__file__))
    import sm90_check

    sm90_check.stand_in()
    canonical_keys()
    done, failed = 0, []
    for line in dict.fromkeys(lines):  # (order kept, duplicates once)
        rec = json.loads(line)
        try:
            _kernel(rec["module"], rec["name"]).preload(_local_libs(rec["data"]))
            done += 1
        except Exception as ex:  # reported, the others still compile
            failed.append(f"{rec['module']}.{rec['name']}: {type(ex).__name__}: {str(ex)[:200]}")
    return done, failed


def with_constexprs(line: str, name: str, values: dict) -> str:
    """A record of kernel `name` with constexprs set to `values` (a constexpr the kernel gained since the record was
    made is appended: it must be the kernel's last parameters, in order); other kernels' records as they are. For
    replaying the records of a call made before a kernel gained an option, and for the option's variants no call has
    compiled yet."""
    rec = json.loads(line)
    if rec["name"] != name:
        return line
    spec = json.loads(rec["data"])
    params = list(spec["signature"])
    head, tail = spec["key"].rsplit("]", 1)  # str(the specialisation list) + str(the options)
    for key, value in values.items():
        if key in params:
            i = params.index(key)
            spec["constant_vals"][spec["constant_keys"].index([i])] = value
            parts = head.split("), (")  # (one entry a parameter, "('constexpr', value)")
            parts[i] = parts[i][: parts[i].index(",") + 1] + f" {value!r}" + (")" if i == len(parts) - 1 else "")
            head = "), (".join(parts)
        else:
            spec["signature"][key] = "constexpr"
            spec["constant_keys"].append([len(params)])
            spec["constant_vals"].append(value)
            params.append(key)
            head += f", ('constexpr', {value!r})"
    spec["key"] = head + "]" + tail
    return json.dumps(dict(rec, data=json.dumps(spec)))


def _value(text: str):
    return {"True": True, "False": False, "None": None}.get(text, int(text) if text.lstrip("-").isdigit() else text)


def prune(cache: str) -> int:
    """Keep of each cache entry its group file, metadata JSON and cubin (what a launch from the cache reads); bytes
    left."""
    total = 0
    for entry in os.listdir(cache):
        d = os.path.join(cache, entry)
        for f in os.listdir(d):
            p = os.path.join(d, f)
            if f.endswith((".json", ".cubin")):
                total += os.path.getsize(p)
            else:
                os.remove(p)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="compiles.jsonl files a device call brought back")
    ap.add_argument("--cache", default=".tcache")
    ap.add_argument("--keep", action="store_true", help="add to the cache (default: start it afresh, so that it holds "
                    "this checkout's kernels only)")  # fmt: skip
    ap.add_argument("--variant", action="append", default=[], metavar="KERNEL:NAME=VALUE[,NAME=VALUE]",
                    help="compile each record of KERNEL with these constexprs instead of as made (appended where the "
                    "record lacks them; several --variant of a kernel: each); e.g. frag_rsw_kernel:LATE=False for "
                    "records made before LATE existed")  # fmt: skip
    args = ap.parse_args()
    lines = [ln for path in args.records for ln in open(path).read().splitlines() if ln.strip()]
    variants = [(v.split(":", 1)[0], dict(kv.split("=") for kv in v.split(":", 1)[1].split(","))) for v in args.variant]
    varied = {kernel for kernel, _ in variants}
    made = [ln for ln in lines if json.loads(ln)["name"] not in varied]
    for kernel, sets in variants:
        values = {k: _value(x) for k, x in sets.items()}
        made += [with_constexprs(ln, kernel, values) for ln in lines if json.loads(ln)["name"] == kernel]
    lines = made
    cache = os.path.abspath(args.cache)
    if not args.keep:
        shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache, exist_ok=True)
    done, failed = replay(lines, cache)
    for why in failed:
        print("failed:", why)
    size = prune(cache)
    print(f"{done} kernels compiled of {len(set(lines))} recorded; {cache}: {size / 2**20:.1f} MiB to carry")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
