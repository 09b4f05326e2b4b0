"""What the probe scripts share: their rows, and what failed, as DIR/NAME.json with where they ran; the
"key=value:key=value" tile overrides their command lines take."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from compile_cache import record_from_env  # noqa: E402

from anybit.bench.provenance import provenance

record_from_env()  # (tools/device.sh on the device: the probe's compiles, for compile_cache.py)


def write_probe(out_dir: str, name: str, rows: list, errors: dict | None = None) -> str:
    """Print what failed, then write {env, rows, errors} to out_dir/name.json (name_2.json, … when a probe of the same
    name wrote there already in this call); returns the path."""
    for what, ex in (errors or {}).items():
        print(f"{what}: {ex}")
    os.makedirs(out_dir, exist_ok=True)
    path, n = os.path.join(out_dir, f"{name}.json"), 1
    while os.path.exists(path):  # a second probe of the same kind in one device call keeps the first one's file
        n += 1
        path = os.path.join(out_dir, f"{name}_{n}.json")
    env = provenance(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    with open(path, "w") as f:
        json.dump(dict(env=env, rows=rows, errors=errors or {}), f, indent=1)
    return path


def probe_parser(doc: str, scheme: str, m: str, tiles: str, peers: str, peers_help: str) -> argparse.ArgumentParser:
    """The command line both ws probes take (their defaults differ): scheme, shapes, M list, kernel variants,
    peers, weight copies, --graph, output directory."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--scheme", default=scheme)
    ap.add_argument("--shapes", default="8192x8192,28672x8192,8192x28672")
    ap.add_argument("--m", default=m)
    ap.add_argument("--tiles", default=tiles, help="ws variants, ';'-separated k=v:k=v")
    ap.add_argument("--peers", default=peers, help=peers_help)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="also CUDA-graph replay and the host µs per call")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    return ap


def humming_peers(ws: list, scheme, peers: str, errors: dict, shape: str) -> list | None:
    """Humming layers of the float weights `ws` for `scheme` where `peers` names humming, else None; a failure is
    written to `errors` (reported, not hidden) and the other cells still run."""
    if "humming" not in peers:
        return None
    try:
        from anybit.bench.peers import humming

        return [humming(w, scheme) for w in ws]
    except Exception as ex:
        errors[f"humming {shape}"] = f"{type(ex).__name__}: {ex}"
        return None


def tile_overrides(text: str) -> dict:
    """ "block_m=128:stages=6" -> {"block_m": 128, "stages": 6} (empty text: {})."""
    return {a: int(b) for a, b in (kv.split("=") for kv in filter(None, text.split(":")))}


def relaunch_err(call, ref: torch.Tensor) -> tuple[float, bool]:
    """(relative error of `call()`'s first rows against the exact product `ref`, whether a relaunch is bit for bit)."""
    y1, y2 = call(), call()
    return float((y1[: ref.shape[0]].double() - ref).norm() / ref.norm()), bool(torch.equal(y1, y2))


REL_BUDGET = 1.6e-2  # bf16 outputs (tests/tolerances.py GEMM_REL_ERR)


def relaunch_why(err: float, same: bool, budget: float = REL_BUDGET) -> str | None:
    """Why a `relaunch_err` result fails (error over budget, or a relaunch that differs), else None."""
    return None if err <= budget and same else f"rel err {err:.2e}, relaunch equal {same}"


def relaunch_check(call, ref: torch.Tensor, budget: float = REL_BUDGET) -> str | None:
    """Why `call()` fails against the exact product of its first rows (`ref`) or a relaunch bit for bit, else None."""
    return relaunch_why(*relaunch_err(call, ref), budget)


def time_cells(cells: dict, n: int, k: int, m: int, graph: bool, width: int = 34) -> list[dict]:
    """Each cell (name -> calls over weight copies): eager CUDA-event median (and, `graph`, CUDA-graph replay and
    host µs per call), a printed line each; returns the rows."""
    from anybit.bench.timing import median, time_eager, time_graph

    rows, flops = [], 2 * m * n * k
    for name, fns in cells.items():
        us = median(time_eager(fns, calls=3 * len(fns), repeats=9, warmup=6, cuda=True))
        row = dict(n=n, k=k, m=m, name=name, us=us, tflops=flops / us / 1e6)
        extra = ""
        if graph:
            row["graph_us"] = median(time_graph(fns, calls=3 * len(fns), repeats=9, warmup=6))
            row["host_us"] = median([host_us(f, 5) for f in fns])
            extra = f"  graph {row['graph_us']:8.1f} µs  host {row['host_us']:6.1f} µs/call"
        rows.append(row)
        print(f"{n:6d}x{k:<6d} M={m:<5d} {name:{width}s} {us:9.1f} µs {flops / us / 1e6:7.1f} TF/s{extra}", flush=True)
    return rows


def host_us(fn, calls: int, rounds: int = 5) -> float:
    """Median over `rounds` of the µs per call a Python loop takes to enqueue `calls` calls of fn (the GPU may still
    be busy after: an eager call far above its graph time is host-bound)."""
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def kernel_us(fns: list) -> dict:
    """Each GPU kernel's device time (torch.profiler), µs a call, over one eager pass of `fns` (callables, e.g. one per
    routing): where a layer's time goes, kernel by kernel (names cut to 40 characters)."""
    for fn in fns:  # (compiled and warm before the profile)
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        for fn in fns:
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[ev.name[:40]] = out.get(ev.name[:40], 0.0) + ev.device_time / len(fns)
    return {name: round(us, 2) for name, us in out.items()}
