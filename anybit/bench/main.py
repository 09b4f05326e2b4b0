"""`anybit bench`: run a recipe on this machine and write table, JSON, Markdown and plot."""

from __future__ import annotations

import dataclasses
import time

import torch

from anybit.bench.provenance import provenance
from anybit.bench.recipe import Recipe, Shape
from anybit.bench.report import print_table, write_outputs
from anybit.bench.runner import Run, run_recipe
from anybit.bench.timing import ceilings


def cpu_size(size: int, cap: int) -> int:
    """One dimension cut to the CPU version's cap, a multiple of 128 so every group fits."""
    return max(128, min(size, cap) // 128 * 128)


def cpu_shapes(recipe: Recipe) -> list[Shape]:
    """The recipe's shapes cut to the CPU version's size (`cpu_size`)."""
    cap_n, cap_k = recipe.cpu.get("max_n", 256), recipe.cpu.get("max_k", 512)
    return [dataclasses.replace(s, n=cpu_size(s.n, cap_n), k=cpu_size(s.k, cap_k)) for s in recipe.shapes]


def run_bench(recipe: Recipe, out_dir: str | None = None, device: str | None = None, quiet: bool = False) -> dict:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        shapes, ms = recipe.shapes, recipe.m
    else:
        print(
            "anybit bench: no CUDA GPU here — running the small CPU version (shapes cut to "
            f"{recipe.cpu.get('max_n')}x{recipe.cpu.get('max_k')}, M {recipe.cpu.get('m')}; torch backend, and the "
            "Triton kernels if TRITON_INTERPRET=1). Times are CPU wall clock, not kernel speed."
        )
        shapes, ms = cpu_shapes(recipe), recipe.cpu.get("m", [1, 16])
    torch.manual_seed(recipe.seed)
    t0 = time.time()
    ceil = ceilings(dev) if dev.type == "cuda" else {}
    run = Run(recipe, dev, ceil)
    total = len(shapes) * len(recipe.schemes) * len(ms)
    try:
        from rich.progress import Progress

        with Progress(transient=True, disable=quiet) as bar:
            task = bar.add_task("bench", total=total)
            run_recipe(run, shapes, ms, lambda s: bar.update(task, advance=1, description=s))
    except ImportError:
        run_recipe(run, shapes, ms)
    result = {
        "env": provenance(dev, recipe.sha256, recipe.seed),
        "recipe": recipe.to_dict(),
        "ceilings": ceil,
        "rows": run.rows,
        "skipped": run.skipped,
        "wall_s": round(time.time() - t0, 1),
    }
    if not quiet:
        print_table(result)
    paths = write_outputs(result, out_dir or recipe.out)
    if not quiet:
        print("wrote", ", ".join(paths.values()))
    result["paths"] = paths
    return result
