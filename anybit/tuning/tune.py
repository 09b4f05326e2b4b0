"""`anybit tune`: measure, ahead of time, the Triton tile and every usable backend for a recipe's
problems on this GPU, and write them into the tuning cache (the Triton backend then uses the tile;
"auto" prefers the fastest backend per M bucket).

Timing follows `anybit bench`: weights rotated over enough copies to stream from HBM, CUDA-graph
replay for M <= the recipe's `graph_max_m` (eager there would time the host, not the kernel), CUDA
events otherwise, the median of the recipe's repeats.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable

import torch

import anybit
from anybit.backends.base import Problem
from anybit.backends.registry import explain, get_backend
from anybit.backends.triton import (
    DEQUANT_MATMUL_MIN_M,
    FRAG_MAX_M,
    TritonBackend,
    _sm_count,
    frag_mid,
    pick_config,
    tuning_cache,
)
from anybit.backends.triton_layout import a8_mma, dense_frag_format
from anybit.bench.recipe import Recipe
from anybit.bench.runner import _copies, _weight
from anybit.bench.timing import median, time_eager, time_graph
from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme
from anybit.kernels.frag_rs import RS_SMALL_MIN_M
from anybit.tuning.autotune import candidates
from anybit.tuning.cache import backend_key, problem_key

TUNED_BACKENDS = ("triton", "humming")


def time_us(fns: list[Callable[[], object]], m: int, recipe: Recipe) -> float:
    """Median µs per call: graph replay for small M, eager CUDA events above."""
    if m <= recipe.graph_max_m:
        return median(time_graph(fns, recipe.graph_calls, recipe.repeats, recipe.warmup))
    return median(time_eager(fns, recipe.graph_calls, recipe.repeats, recipe.warmup, True))


def _uses_tiles(scheme: Scheme, m: int, n: int, k: int, device: torch.device) -> bool:
    """Whether the Triton backend's call at this M runs the tiled GEMM (not dequantize + cuBLAS or `frag_ws`)."""
    if dense_frag_format(scheme) and not a8_mma(scheme):  # FP8-MMA frag weights run their kernel at every M
        return m <= FRAG_MAX_M or frag_mid(scheme, m, n, k, torch.bfloat16, device)  # tune_problem's x is bf16
    return a8_mma(scheme) or m <= DEQUANT_MATMUL_MIN_M


def _register_operand_route(tw, x: torch.Tensor) -> bool:
    """Whether the Triton backend's call runs this frag A16 weight on the register-operand kernel (`gemm_frag_rs`:
    33-64 rows of some weights, `frag_rs.rs_tile`), whose tile is its own: no frag tile to tune there."""
    if not tw.frag or tw.mma_a8 or x.shape[0] <= RS_SMALL_MIN_M:
        return False
    tile = TritonBackend._ws_tile(x, tw)
    return tile is not None and "rs" in tile


def tune_problem(qw, copies: int, m: int, recipe: Recipe, device: torch.device, backends) -> dict:
    """Tune one (weight, M): the Triton tile among candidates, then each backend's time; all into the
    cache. Returns {"triton_tile": config or None, "us": {backend: µs}, "errors": {backend: text}}."""
    scheme, n, k = qw.scheme, qw.n, qw.k
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    problem = Problem(scheme, n, k, m, device, x.dtype)
    usable = {name for name, ok, _ in explain(problem) if ok}
    cache = tuning_cache(device)
    key = problem_key(scheme, n, k, m, x.dtype)
    out: dict = {"triton_tile": None, "us": {}, "errors": {}}
    for name in backends:
        if name not in usable:
            continue
        be, preps = get_backend(name), []
        try:
            preps = [be.prepare(qw) for _ in range(copies)]
            tiled = name == "triton" and _uses_tiles(scheme, m, n, k, device)
            if tiled and not _register_operand_route(preps[0].data, x):
                tw = preps[0].data
                default = pick_config(m, n, k, scheme, _sm_count(device), False, tw.nk, tw.mma_a8, tw.frag)
                best, best_us = None, float("inf")
                for c in candidates(default, preps[0].data.frag):
                    for p in preps:
                        p.data.configs[m] = c
                    try:
                        us = time_us([lambda p=p, be=be: be.gemm(x, p) for p in preps], m, recipe)
                    except Exception:  # noqa: BLE001 - a tile that does not fit this GPU is no candidate
                        torch.cuda.synchronize()
                        continue
                    if us < best_us:
                        best, best_us = c, us
                if best is None:
                    raise RuntimeError("no candidate tile ran")
                cache.put(key, dataclasses.asdict(best), best_us)
                out["triton_tile"] = dataclasses.asdict(best)
                us = best_us
            else:
                us = time_us([lambda p=p, be=be: be.gemm(x, p) for p in preps], m, recipe)
            cache.put(backend_key(key, name), {}, us)
            out["us"][name] = us
        except Exception as e:  # a backend failing one problem is reported, the run goes on
            out["errors"][name] = f"{type(e).__name__}: {e}"[:200]
        finally:
            del preps
    return out


def run_tune(recipe: Recipe, device: str | None = None, backends=TUNED_BACKENDS, write_to: str | None = None) -> list:
    """Tune every (shape, scheme, M) of `recipe` within its budget; returns one row per problem.
    `write_to`: also copy the resulting cache file there (how the shipped tables are made: fold it into the shipped
    table with tools/merge_table.py, which keeps the table's other problems)."""
    if not torch.cuda.is_available():
        raise AnybitError("anybit tune measures kernels on a CUDA GPU and there is none here")
    dev = torch.device(device or "cuda")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    t0, rows = time.time(), []
    total = len(recipe.shapes) * len(recipe.schemes) * len(recipe.m)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("tune", total=total)
        for shape in recipe.shapes:
            w = _weight(shape, recipe.seed, dev)
            for text in recipe.schemes:
                qw = anybit.quantize(w, Scheme.parse(text))
                copies = _copies(qw.nbytes, l2)
                for m in recipe.m:
                    bar.update(task, advance=1, description=f"{shape.name} {text} M={m}")
                    row = dict(shape=shape.name, n=shape.n, k=shape.k, scheme=text, m=m)
                    if time.time() - t0 > recipe.budget_s:
                        row["status"] = f"skipped: over the {recipe.budget_s:g} s budget"
                    else:
                        row.update(tune_problem(qw, copies, m, recipe, dev, backends))
                    rows.append(row)
                del qw
                torch.cuda.empty_cache()
    if write_to:
        cache = tuning_cache(dev)
        dest = os.path.join(write_to, os.path.relpath(cache.path, os.path.dirname(os.path.dirname(cache.path))))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(cache.path, dest)
    return rows


def print_rows(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="anybit tune: fastest backend per problem (µs; graph replay at small M)")
    for col in ("shape", "scheme", "M", "fastest", "µs by backend", "triton tile"):
        t.add_column(col)
    for r in rows:
        us = r.get("us") or {}
        why = r.get("status") or "; ".join(f"{b}: {e}" for b, e in r.get("errors", {}).items())
        best = min(us, key=us.get) if us else why
        tile = r.get("triton_tile")
        tile_s = f"{tile['block_m']}x{tile['block_n']}x{tile['block_k']} s{tile['split_k']}" if tile else "-"
        t.add_row(r["shape"], r["scheme"], str(r["m"]), best, "  ".join(f"{b} {v:.1f}" for b, v in us.items()), tile_s)
    Console().print(t)
