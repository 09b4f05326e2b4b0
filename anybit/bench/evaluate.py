"""`anybit eval`: how far each scheme's output is from the float layer, anybit's and its peers' side by side.

For every recipe shape and scheme, one float weight and activations of each input kind go through `quantize()` and
every anybit backend asked for, and through the peers that quantize the same float weight themselves (Humming in the
same format, torch FP8 `_scaled_mm`, tinygemm int4). Each output is compared with the float64 product of the
unquantized weight and activations (what the user loses); anybit's also with the exact product of its own quantized
weight and activations (the kernel's error alone, which must stay within `MAX_REL_ERR`, else the cell says WRONG).

Input kinds: `gaussian` (w ~ N(0, 0.02), x ~ N(0, 1)) and `outliers`, closer to a trained LLM layer: w with
heavy tails (Student t, 4 degrees of freedom) and x with a few input channels 50x larger than the rest, the
activation outliers that per-token FP8 quantization and small weight groups have to live with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

import anybit
from anybit.backends import get_backend
from anybit.backends.base import Problem
from anybit.backends.registry import choose_with_reason
from anybit.bench import peers as peer_lib
from anybit.bench.main import cpu_shapes, cpu_size
from anybit.bench.provenance import provenance
from anybit.bench.recipe import Recipe, Shape
from anybit.bench.runner import MAX_REL_ERR
from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme

INPUTS = ("gaussian", "outliers")
OUTLIER_CHANNELS = 0.01  # the share of x's input channels that are outliers
OUTLIER_GAIN = 50.0
UNQUANTIZED = "unquantized"  # the scheme column of the float weight in the activations' dtype: rounding alone
EVAL_M = 64  # rows of x a cell uses where --m does not say (the error does not depend on M: per-row quantization)
MOE_EXPERTS = 32


def inputs(kind: str, n: int, k: int, m: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight (n, k) and float32 activations (m, k) of one input kind, the same for every scheme."""
    if kind not in INPUTS:
        raise AnybitError(f"input kind {kind!r}: valid kinds are {list(INPUTS)}")
    g = torch.Generator(device="cpu").manual_seed(seed + 7919 * n + k)
    if kind == "gaussian":
        w, x = torch.randn(n, k, generator=g) * 0.02, torch.randn(m, k, generator=g)
    else:
        # Student t with 4 degrees of freedom, N(0, 1) / sqrt(chi2_4 / 4) (the chi2 from 4 squared normals): drawn
        # from this generator, not torch's global one
        chi2 = (torch.randn(4, n, k, generator=g) ** 2).sum(0)
        w = torch.randn(n, k, generator=g) / (chi2 / 4).sqrt() * 0.02
        x = torch.randn(m, k, generator=g)
        chans = torch.randperm(k, generator=g)[: max(1, int(k * OUTLIER_CHANNELS))]
        x[:, chans] *= OUTLIER_GAIN
    return w.to(device), x.to(device)


def _rows_of_x(m: int | None) -> int:
    """--m, or EVAL_M where it was not given; a clear error for a count that is not positive."""
    if m is not None and m < 1:
        raise AnybitError(f"--m {m}: give a positive number of rows of x (default {EVAL_M})")
    return m or EVAL_M


def _device_dtype(device: str | None) -> tuple[torch.device, torch.dtype]:
    """Where an eval runs and x's dtype there: bf16 on a GPU, fp16 on the CPU (the interpreter's bf16 is wrong)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, torch.bfloat16 if dev.type == "cuda" else torch.float16


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm().clamp(min=1e-300))


def _anybit_outputs(recipe: Recipe, qw, scheme: Scheme, shape: Shape, x: torch.Tensor) -> list[tuple]:
    """(name, output or the reason there is none, exact product) per recipe backend, "auto" as the chooser picks."""
    exact = get_backend("torch").gemm(x, anybit.prepare(qw, backend="torch")).double()
    out, seen = [], set()
    for b in recipe.backends:
        try:
            chosen, _ = choose_with_reason(Problem(scheme, shape.n, shape.k, x.shape[0], x.device, x.dtype), b)
            if chosen in seen:  # "auto" picked a backend the recipe also names
                continue
            seen.add(chosen)
            be = get_backend(chosen)
            out.append((f"anybit:{chosen}", be.gemm(x, be.prepare(qw)), exact))
        except Exception as e:  # a backend that cannot run the cell says why in it
            out.append((f"anybit:{b}", f"{type(e).__name__}: {e}"[:200], exact))
    return out


def _peer_outputs(recipe: Recipe, w: torch.Tensor, scheme: Scheme, x: torch.Tensor, gpu: bool) -> list[tuple]:
    """(name, output or the reason there is none, None) per recipe peer that runs this scheme's kind of weight: Humming
    in the same format, tinygemm for int4 g128, FP8 `_scaled_mm` (channel weight, token x) beside FP8 activations."""
    builders: dict[str, Callable] = {
        "humming": lambda: peer_lib.humming(w, scheme),
        "tinygemm": lambda: peer_lib.tinygemm(w, scheme),
        "torch-fp8": lambda: peer_lib.torch_fp8(w),
    }
    out = []
    for name, build in builders.items():
        if name not in recipe.peers or not gpu:  # every peer needs a CUDA GPU
            continue
        if name == "torch-fp8" and not scheme.act.quantized:
            continue
        try:
            out.append((name, build()(x), None))
        except peer_lib.Unsupported as e:
            out.append((name, f"unsupported: {e}", None))
        except Exception as e:
            out.append((name, f"{type(e).__name__}: {e}"[:200], None))
    return out


def evaluate(recipe: Recipe, kinds: list[str], m: int | None = None, device: str | None = None) -> dict:
    """The rows of an eval run: one per (shape, scheme, input kind, system)."""
    dev, dtype = _device_dtype(device)
    shapes = recipe.shapes
    if dev.type != "cuda":  # cut to the CPU version's size; shapes that become one are evaluated once
        shapes = list({(s.n, s.k): s for s in reversed(cpu_shapes(recipe))}.values())[::-1]
    m = _rows_of_x(m)
    rows, t0 = [], time.time()
    for shape in shapes:
        for kind in kinds:
            w, xf = inputs(kind, shape.n, shape.k, m, recipe.seed, dev)
            x = xf.to(dtype)
            ref = x.double() @ w.double().T  # the float layer on the activations as the model holds them
            base = dict(shape=shape.name, n=shape.n, k=shape.k, m=m, inputs=kind)
            rows.append(base | dict(scheme=UNQUANTIZED, system="unquantized", err=_rel(x @ w.to(dtype).T, ref)))
            for text in recipe.schemes:
                scheme = Scheme.parse(text)
                qw = anybit.quantize(w, scheme)
                w_err = _rel(qw.dequantize(), w.double())
                systems = _anybit_outputs(recipe, qw, scheme, shape, x) + _peer_outputs(recipe, w, scheme, x, x.is_cuda)
                rows += [_row(base | dict(scheme=text, weight_err=w_err), name, y, exact, ref, scheme, dev)
                         for name, y, exact in systems]  # fmt: skip
                del qw
    for up, _ in moe_pairs(recipe.shapes):  # a MoE recipe: its whole layer as well
        for kind in kinds:
            rows += _moe_rows(recipe, up, kind, m, dev, dtype)
    return dict(env=provenance(dev, recipe.sha256, recipe.seed), recipe=recipe.to_dict(), inputs=kinds, m=m,
                rows=rows, wall_s=round(time.time() - t0, 1))  # fmt: skip


def _row(base: dict, system: str, y, exact, ref, scheme: Scheme, dev: torch.device) -> dict:
    """One system's cell: its status where it gave no output; else its error against the float layer (`ref`, where
    there is one) and, for anybit's systems (an `exact` product), the kernel's error and the verdict on it."""
    row = base | dict(system=system)
    if isinstance(y, str):
        return row | dict(status=y)
    if ref is not None:
        row["err"] = _rel(y, ref)
    if exact is None:
        return row | dict(status="ok")
    row["kernel_err"] = _rel(y, exact)
    return row | dict(status=_kernel_status(row["kernel_err"], scheme, system == "anybit:triton", dev))


def _kernel_status(err: float, scheme: Scheme, triton: bool, dev: torch.device) -> str:
    """ok within `MAX_REL_ERR`; else WRONG, except where Triton kernels (`triton`) ran under the interpreter on FP8
    activations."""
    if err < MAX_REL_ERR:
        return "ok"
    if dev.type == "cpu" and scheme.act.quantized and triton and os.environ.get("TRITON_INTERPRET"):
        # Triton's interpreter rounds a few % of fp32 -> fp8 conversions wrongly (a whole step, measured 2.4 % of
        # the elements): the activations the kernel quantized differ from torch's; the GPU checks this cell
        return "unchecked: the interpreter's fp8 rounding"
    return "WRONG"


def moe_pairs(shapes: list[Shape]) -> list[tuple[Shape, Shape]]:
    """The (gate_up, down) expert shapes of a MoE recipe: gate_up (E, 2I, H) and down (E, H, I) of the same E, top-k."""
    ups = [s for s in shapes if s.experts and s.n % 2 == 0]
    return [(u, d) for u in ups for d in shapes
            if d.experts == u.experts and d.topk == u.topk and d.n == u.k and 2 * d.k == u.n]  # fmt: skip


def _moe_rows(recipe: Recipe, up: Shape, kind: str, m: int, dev: torch.device, dtype: torch.dtype) -> list[dict]:
    """One MoE layer (`QuantMoE`) per scheme against the float64 layer of the unquantized experts, and against the
    layer's exact path (every expert through the torch backend); softmax top-k routing of random logits."""
    from anybit.moe import QuantMoE, softmax_topk

    # at most MOE_EXPERTS experts (the error does not depend on how many there are; DeepSeek-V3's 256 in fp32 would
    # be 45 GB); the CPU version also cuts the sizes like the dense shapes'
    e, h, i = min(up.experts, MOE_EXPERTS), up.k, up.n // 2
    if dev.type != "cuda":
        e, h, i = min(e, 8), cpu_size(h, recipe.cpu["max_k"]), cpu_size(i, recipe.cpu["max_n"])
    topk = min(up.topk, e)
    gu = torch.stack([inputs(kind, 2 * i, h, 1, recipe.seed + j, dev)[0] for j in range(e)])
    dn = torch.stack([inputs(kind, h, i, 1, recipe.seed + 7 * j + 1, dev)[0] for j in range(e)])
    x = inputs(kind, 1, h, m, recipe.seed, dev)[1].to(dtype)
    g = torch.Generator(device="cpu").manual_seed(recipe.seed + e)
    weights, ids = softmax_topk(torch.randn(m, e, generator=g).to(dev), topk)
    ref = torch.zeros(m, h, dtype=torch.float64, device=dev)
    for t in range(m):  # the float layer: sum_j w[t, j] * down_e(silu(gate_e(x)) * up_e(x))
        for j in range(topk):
            a = gu[ids[t, j]].double() @ x[t].double()
            ref[t] += weights[t, j].double() * (dn[ids[t, j]].double() @ (torch.nn.functional.silu(a[:i]) * a[i:]))
    name = f"moe E={e} top-{topk}"  # its N×K column: H×I
    backend = "auto" if "auto" in recipe.backends else recipe.backends[0]
    system = f"anybit:QuantMoE({backend})"
    rows = []
    for text in recipe.schemes:
        base = dict(shape=name, n=h, k=i, m=m, inputs=kind, scheme=text)
        try:
            moe = QuantMoE.from_float(gu, dn, text, backend=backend)
            exact = QuantMoE(moe.gate_up, moe.down, backend="torch")(x, weights, ids).double()
            w_err = (((moe.gate_up.dequantize().double() - gu.double()).norm() ** 2 +
                      (moe.down.dequantize().double() - dn.double()).norm() ** 2) /
                     (gu.double().norm() ** 2 + dn.double().norm() ** 2)).sqrt().item()  # fmt: skip
            y = moe(x, weights, ids)
        except Exception as ex:  # a scheme the layer cannot run says why in its cell
            rows.append(base | dict(system=system, status=f"{type(ex).__name__}: {ex}"[:200]))
            continue
        err = _rel(y, exact)
        status = _kernel_status(err, Scheme.parse(text), backend != "torch", dev)
        rows.append(base | dict(system=system, weight_err=w_err, err=_rel(y, ref), kernel_err=err,
                                status=status))  # fmt: skip
    return rows


def evaluate_checkpoint(model_dir: str, backends: list[str], kinds: list[str], m: int | None = None,
                        device: str | None = None, seed: int = 0) -> dict:  # fmt: skip
    """A quantized checkpoint's layers (`anybit.checkpoints.load`): each anybit backend's output against the exact
    product of the layer's own weight (no float weight to compare with), on activations of each input kind — whether
    anybit runs this checkpoint correctly here. Expert stacks are listed, not evaluated (the MoE layer's own tests
    and `tools/moe_bench.py` check them)."""
    from anybit.checkpoints import load

    dev, dtype = _device_dtype(device)
    m = _rows_of_x(m)
    recipe = Recipe(name=model_dir, shapes=[], schemes=[], m=[m], backends=list(backends))
    rows, t0 = [], time.time()
    for layer in load(model_dir):
        qw = layer.qweight.to(dev)
        shape = Shape(layer.name, qw.n, qw.k)
        for kind in kinds:
            base = dict(shape=layer.name, n=qw.n, k=qw.k, m=m, inputs=kind, scheme=str(qw.scheme))
            if qw.lead:
                rows.append(base | dict(system="-", status=f"expert stack {tuple(qw.lead)}: not evaluated"))
                continue
            _, xf = inputs(kind, 1, qw.k, m, seed, dev)
            x = xf.to(dtype)  # an act-order layer's x is permuted first: the same x for both sides here
            rows += [_row(base, name, y, exact, None, qw.scheme, dev)
                     for name, y, exact in _anybit_outputs(recipe, qw, qw.scheme, shape, x)]  # fmt: skip
        del qw
    if not rows:
        raise AnybitError(f"{model_dir}: the checkpoint holds no quantized layer")
    return dict(env=provenance(dev), checkpoint=model_dir, inputs=kinds, m=m, rows=rows,
                wall_s=round(time.time() - t0, 1))  # fmt: skip


def table(result: dict) -> tuple[list[str], list[list[str]]]:
    """Header and lines, one per (shape, input kind, scheme): the weight's error, then each system's output error
    against the float layer ("–" where it did not run: see the JSON's status) and anybit's worst kernel error. A
    checkpoint's (no float weight): one per (layer, input kind), each anybit backend's kernel error."""
    checkpoint = "checkpoint" in result
    value = "kernel_err" if checkpoint else "err"
    systems = list(dict.fromkeys(r["system"] for r in result["rows"] if r["scheme"] != UNQUANTIZED and value in r))
    names = [s.removeprefix("anybit:") for s in systems]
    header = ["layer", "N×K", "inputs", "scheme", *names] if checkpoint else \
        ["shape", "N×K", "inputs", "scheme", "weight err", *names, "kernel err"]  # fmt: skip
    cells: dict[tuple, dict] = {}
    for r in result["rows"]:
        cells.setdefault((r["shape"], f"{r['n']}×{r['k']}", r["inputs"], r["scheme"]), {})[r["system"]] = r
    lines = []
    for key, by_system in cells.items():
        if key[3] == UNQUANTIZED:  # the float weight in x's dtype (the output's rounding alone): in the summary
            continue
        rows = list(by_system.values())
        errs = [_e(by_system[s].get(value)) if s in by_system else "–" for s in systems]
        wrong = [r["system"] for r in rows if r.get("status") == "WRONG"]
        odd = sorted({r["status"] for r in rows if r.get("status") not in ("ok", "WRONG")})
        status = "WRONG: " + ", ".join(wrong) if wrong else (odd[0] if odd else "ok")
        if checkpoint:
            lines.append([*key, *errs, status])
            continue
        kernel = [r["kernel_err"] for r in rows if "kernel_err" in r]
        lines.append([*key, _e(rows[0].get("weight_err")), *errs, _e(max(kernel) if kernel else None), status])
    return header + ["status"], lines


def summary(result: dict) -> list[str]:
    """anybit's output error against Humming's, in the cells both ran (same scheme, same float weight)."""
    by_cell: dict[tuple, dict] = {}
    for r in result["rows"]:
        if "err" in r and r["scheme"] != UNQUANTIZED:
            by_cell.setdefault((r["shape"], r["scheme"], r["inputs"]), {})[r["system"]] = r["err"]
    out = [f"{r['shape']} {r['inputs']}: the float weight in x's dtype {r['err']:.2e} (the output's rounding alone)"
           for r in result["rows"] if r["scheme"] == UNQUANTIZED]  # fmt: skip
    for (shape, scheme, kind), errs in by_cell.items():
        ours = [v for s, v in errs.items() if s.startswith("anybit:")]
        if ours and "humming" in errs:
            ratio = min(ours) / errs["humming"]
            out.append(f"{shape} {scheme} {kind}: anybit's error {ratio:.2f}x Humming's")
    wrong = [r for r in result["rows"] if r.get("status") == "WRONG"]
    out += [f"WRONG: {r['shape']} {r['scheme']} {r['inputs']} {r['system']} kernel_err {r['kernel_err']:.2e}"
            for r in wrong]  # fmt: skip
    return out


def _e(v) -> str:
    return "–" if v is None else f"{v:.2e}"
