"""Run a recipe: for every shape, scheme and M, check every backend and peer against the exact path
once, then time it (eager and/or CUDA-graph replay). Produces the rows of the result JSON."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import anybit
from anybit.backends import get_backend
from anybit.backends.base import Problem
from anybit.backends.registry import choose_with_reason
from anybit.bench import peers as peer_lib
from anybit.bench.recipe import Recipe, Shape
from anybit.bench.timing import median, time_eager, time_graph
from anybit.formats.scheme import Scheme

# an anybit output farther than this from the exact path (relative Frobenius error) is reported
# as wrong and not timed; bf16 output rounding alone is ~2e-3 (tests/tolerances.py holds the
# per-dtype test bounds)
MAX_REL_ERR = 2e-2
ROTATION_BYTES_CAP = 8 << 30


@dataclass
class Run:
    recipe: Recipe
    device: torch.device
    ceilings: dict
    rows: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.time)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.recipe.budget_s


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


def _copies(nbytes: int, l2: int) -> int:
    """Weight copies to rotate over so a graph of calls streams them from HBM, not L2."""
    if not l2:
        return 1
    return max(1, min(math.ceil(2 * l2 / max(nbytes, 1)) + 1, ROTATION_BYTES_CAP // max(nbytes, 1)))


def _floor_us(run: Run, scheme: Scheme | None, weight_bytes: int, m: int, n: int, k: int) -> float | None:
    c = run.ceilings
    if not c:
        return None
    fp8 = scheme is not None and scheme.act.quantized and "fp8_flops" in c
    peak = c["fp8_flops"] if fp8 else c["bf16_flops"]
    bytes_ = weight_bytes + 2 * m * (k + n)
    return max(bytes_ / c["copy_Bps"], 2 * m * n * k / peak) * 1e6


# a call slower than this is timed alone, 5 samples: a slow fallback must not eat the run's budget
SLOW_CALL_US = 2000.0


def _one_call_us(run: Run, fn: Callable, x: torch.Tensor) -> float:
    """Host-timed µs of one synchronised call (the estimate that decides whether a cell is a slow call)."""
    t = time.time()
    fn(x)
    if run.cuda:
        torch.cuda.synchronize()
    return (time.time() - t) * 1e6


def _time(run: Run, fns: list[Callable], m: int, estimate_us: float) -> dict:
    r = run.recipe
    out = {}
    if not run.cuda:
        s = time_eager(fns, r.cpu["calls"], r.cpu["repeats"], 1, False)
        return dict(eager_us=median(s), eager_samples=s)
    if estimate_us > SLOW_CALL_US:
        s = time_eager(fns, 1, min(r.repeats, 5), 1, True)
        return dict(eager_us=median(s), eager_samples=s, note="slow call: 5 samples of 1 call, no graph")
    if r.timing in ("eager", "both"):
        s = time_eager(fns, r.graph_calls, r.repeats, r.warmup, run.cuda)
        out.update(eager_us=median(s), eager_samples=s)
    if run.cuda and r.timing in ("graph", "both") and m <= r.graph_max_m:
        try:
            s = time_graph(fns, r.graph_calls, r.repeats, r.warmup)
            out.update(graph_us=median(s), graph_samples=s)
        except Exception as e:  # e.g. a host synchronisation inside the call: eager numbers stand
            out["graph_status"] = f"not capturable: {type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
    return out


def _measure(
    run: Run, row: dict, make: Callable[[], list[Callable]], ref: torch.Tensor, x: torch.Tensor, gate: bool
) -> dict:
    """Build the callables (timing the first call: JIT compile included), check, time."""
    try:
        t = time.time()
        fns = make()
        y = fns[0](x)
        if run.cuda:
            torch.cuda.synchronize()
        row["first_call_s"] = round(time.time() - t, 3)
        row["rel_err"] = _rel_err(y, ref)
        if gate and not row["rel_err"] < MAX_REL_ERR:
            row["status"] = f"wrong: rel_err {row['rel_err']:.2e} >= {MAX_REL_ERR:g}, not timed"
            return row
        for f in fns[1:]:  # every copy's first call (a backend may build its layout lazily) is warm-up
            f(x)
        if run.cuda:
            torch.cuda.synchronize()
        estimate_us = min(_one_call_us(run, fns[-1], x) for _ in range(3))  # one hiccup must not make it "slow"
        row.update(_time(run, [lambda f=f: f(x) for f in fns], row["m"], estimate_us))
        row["status"] = "ok"
    except peer_lib.Unsupported as e:
        row["status"] = f"unsupported: {e}"
    except Exception as e:  # a backend or peer that fails is reported in its cell, the run goes on
        row["status"] = f"error: {type(e).__name__}: {e}"[:300]
    return row


def _cell(run: Run, shape: Shape, text: str, scheme: Scheme | None, m: int, name: str, kind: str, nbytes: int,
          make, x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor | None, info: dict) -> dict:  # fmt: skip
    """One measured cell: anybit rows are gated on the exact path `ref`; peers report their error
    against the unquantized float product."""
    row = dict(shape=shape.name, n=shape.n, k=shape.k, experts=shape.experts, scheme=text, m=m, backend=name,
               kind=kind, weight_bytes=nbytes, **info)  # fmt: skip
    row["floor_us"] = _floor_us(run, scheme, nbytes, m, shape.n, shape.k)
    if isinstance(make, str):
        row["status"] = make
    else:
        gate = ref is not None
        _measure(run, row, make, ref if gate else x.float() @ w.float().T, x, gate=gate)
    return row


def _weight(shape: Shape, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed + shape.n * 7919 + shape.k)
    return (torch.randn(shape.n, shape.k, generator=g) * 0.02).to(device)


def run_recipe(run: Run, shapes: list[Shape], ms: list[int], progress: Callable[[str], None] = lambda s: None):
    r = run.recipe
    l2 = torch.cuda.get_device_properties(run.device).L2_cache_size if run.cuda else 0
    for shape in shapes:
        w = _weight(shape, r.seed, run.device)
        free = _scheme_free_peers(run, shape, w, l2)
        for text in r.schemes:
            scheme = Scheme.parse(text)
            if run.over_budget():
                run.skipped.append(f"{shape.label} {text}: over the {r.budget_s:g} s budget")
                for _ in ms:
                    progress(text)
                continue
            qw = anybit.quantize(w, scheme)
            n_copies = _copies(qw.nbytes, l2)
            peers = _peer_makers(run, w, scheme, text, n_copies)
            for m in ms:
                progress(f"{shape.name} {text} M={m}")
                if run.over_budget():
                    run.skipped.append(f"{shape.label} {text} M={m}: over the {r.budget_s:g} s budget")
                    continue
                x = torch.randn(m, shape.k, device=run.device, dtype=torch.bfloat16 if run.cuda else torch.float16)
                exact = get_backend("torch").gemm(x, anybit.prepare(qw, backend="torch"))
                for name, kind, make, info in _anybit_makers(run, qw, scheme, shape, n_copies, m, x.dtype) + peers:
                    ref = exact if kind == "anybit" else None
                    run.rows.append(_cell(run, shape, text, scheme, m, name, kind, qw.nbytes, make, x, w, ref, info))
                for name, make in free:
                    if not any(f["backend"] == name and f["m"] == m and f["shape"] == shape.name for f in run.rows):
                        nbytes = shape.n * shape.k * (2 if name == "torch-bf16" else 1)
                        run.rows.append(_cell(run, shape, "-", None, m, name, "peer", nbytes, make, x, w, None, {}))
            del qw, peers
            if run.cuda:
                torch.cuda.empty_cache()


def _anybit_makers(run: Run, qw, scheme: Scheme, shape: Shape, n_copies: int, m: int, dtype) -> list[tuple]:
    """One maker per recipe backend; "auto" is the chooser's pick for this M (measured data included)."""
    out = []
    for b in run.recipe.backends:
        try:
            chosen, why = choose_with_reason(Problem(scheme, shape.n, shape.k, m, run.device, dtype), b)
        except anybit.AnybitError as e:
            out.append((f"anybit:{b}", "anybit", f"unsupported: {e}", {}))
            continue
        be = get_backend(chosen)
        copies = 1 if chosen == "torch" else n_copies  # the torch path dequantizes per call anyway

        def make(be=be, copies=copies):
            preps = [be.prepare(qw) for _ in range(copies)]
            return [lambda x, p=p: be.gemm(x, p) for p in preps]

        info = {"picked_by": b} | ({"why": why} if b == "auto" else {})
        out.append((f"anybit:{chosen}" if b == "auto" else f"anybit:{b}", "anybit", make, info))
    return out


def _peer_makers(run: Run, w: torch.Tensor, scheme: Scheme, text: str, n_copies: int) -> list[tuple]:
    out = []
    for name, build in (("tinygemm", peer_lib.tinygemm), ("humming", peer_lib.humming)):
        if name not in run.recipe.peers:
            continue
        if not run.cuda:
            out.append((name, "peer", "unsupported: needs a CUDA GPU", {}))
            continue

        def make(build=build):
            return [build(w, scheme) for _ in range(n_copies)]

        out.append((name, "peer", make, {}))
    return out


def _scheme_free_peers(run: Run, shape: Shape, w: torch.Tensor, l2: int) -> list[tuple]:
    out = []
    for name in peer_lib.SCHEME_FREE:
        if name not in run.recipe.peers:
            continue
        build = {
            "torch-bf16": peer_lib.torch_bf16,
            "torch-fp8": peer_lib.torch_fp8,
            "torch-fp8-mm": lambda w: peer_lib.torch_fp8(w, quantize_x=False),
        }[name]
        if name.startswith("torch-fp8") and not run.cuda:
            out.append((name, "unsupported: FP8 _scaled_mm needs an sm_89+ GPU"))
            continue
        copies = _copies(w.numel() * 2, l2)
        out.append((name, lambda build=build, copies=copies: [build(w) for _ in range(copies)]))
    return out
