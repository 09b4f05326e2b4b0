"""What a bench run prints and writes: the terminal table, JSON, a Markdown summary, a PNG plot, and
the comparison of two result files (the regression gate)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

from anybit.errors import AnybitError

PEER_COLUMNS = ("torch-bf16", "torch-fp8", "torch-fp8-mm", "tinygemm", "humming")


def best_us(row: dict) -> float | None:
    """The time a cell is judged by: graph replay where measured (small M), else eager."""
    if row.get("status") != "ok":
        return None
    return row.get("graph_us", row.get("eager_us"))


def cells(rows: list[dict]) -> list[dict]:
    """One line per (shape, scheme, M) and anybit backend, with the peers of the same shape and M."""
    peers = defaultdict(dict)  # (shape, m) -> scheme-free peers; (shape, scheme, m) -> scheme peers
    for r in rows:
        if r["kind"] == "peer":
            key = (r["shape"], r["m"]) if r["scheme"] == "-" else (r["shape"], r["scheme"], r["m"])
            peers[key][r["backend"]] = r
    out = []
    for r in rows:
        if r["kind"] != "anybit":
            continue
        line = dict(r)
        line["us"] = best_us(r)
        for p in PEER_COLUMNS:
            pr = peers[(r["shape"], r["m"])].get(p) or peers[(r["shape"], r["scheme"], r["m"])].get(p)
            line[p] = best_us(pr) if pr else None
            line[p + "_status"] = pr["status"] if pr else "not run"
        us = line["us"]
        flops = 2 * r["m"] * r["n"] * r["k"]
        line["tflops"] = flops / (us * 1e-6) / 1e12 if us else None
        line["gbps"] = (r["weight_bytes"] + 2 * r["m"] * (r["n"] + r["k"])) / (us * 1e-6) / 1e9 if us else None
        line["pct_floor"] = 100 * r["floor_us"] / us if us and r.get("floor_us") else None
        line["vs_bf16"] = line["torch-bf16"] / us if us and line["torch-bf16"] else None
        line["vs_humming"] = line["humming"] / us if us and line["humming"] else None
        out.append(line)
    return out


def _fmt(v, spec=".1f", none="–"):
    return none if v is None else format(v, spec)


HEADER = [
    "shape",
    "N×K",
    "scheme",
    "M",
    "backend",
    "µs",
    "TF/s",
    "GB/s",
    "% floor",
    "×bf16",
    "bf16",
    "fp8",
    "fp8 mm",
    "tinygemm",
    "humming",
    "humming/anybit",
]


def table_rows(lines: list[dict]) -> list[list[str]]:
    out = []
    for c in lines:
        us = _fmt(c["us"]) if c["us"] is not None else c["status"][:40]
        out.append(
            [
                c["shape"],
                f"{c['n']}×{c['k']}",
                c["scheme"],
                str(c["m"]),
                c["backend"].removeprefix("anybit:"),
                us,
                _fmt(c["tflops"]),
                _fmt(c["gbps"], ".0f"),
                _fmt(c["pct_floor"], ".0f"),
                _fmt(c["vs_bf16"], ".2f"),
                _fmt(c["torch-bf16"]),
                _fmt(c["torch-fp8"]),
                _fmt(c["torch-fp8-mm"]),
                _fmt(c["tinygemm"]),
                _fmt(c["humming"]),
                _fmt(c["vs_humming"], ".2f"),
            ]
        )
    return out


def summary(lines: list[dict]) -> list[str]:
    """Where anybit wins and loses against each peer (cells both measured)."""
    out = []
    for p in PEER_COLUMNS:
        both = [c for c in lines if c["us"] and c[p]]
        if not both:
            continue
        wins = [c for c in both if c["us"] <= c[p]]
        worst = sorted(both, key=lambda c: c[p] / c["us"])[:3]
        lose = ", ".join(
            f"{c['shape']} {c['scheme']} M={c['m']} ({c[p] / c['us']:.2f}×)" for c in worst if c["us"] > c[p]
        )
        out.append(f"vs {p}: anybit faster in {len(wins)}/{len(both)} cells" + (f"; slowest: {lose}" if lose else ""))
    return out


def print_rows(title: str, header: list[str], lines: list[list[str]], left: tuple[str, ...] | None = None) -> None:
    """A table on the terminal (rich; plain text if it is missing): columns named in `left` (all if None) flush left,
    the others right."""
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, show_lines=False)
        for h in header:
            t.add_column(h, justify="left" if left is None or h in left else "right")
        for r in lines:
            t.add_row(*r)
        Console(width=200).print(t)
    except ImportError:  # rich is a dependency; plain text keeps a broken install readable
        print(title)
        for r in [header, *lines]:
            print(" | ".join(r))


def print_table(result: dict) -> None:
    lines = cells(result["rows"])
    title = f"anybit bench — {result['recipe']['name']} on {result['env'].get('gpu')}"
    print_rows(title, HEADER, table_rows(lines), left=("shape", "scheme", "backend"))
    for s in summary(lines):
        print(s)
    for s in result.get("skipped", []):
        print("skipped:", s)


def markdown(result: dict, schemes: list[str] | None = None) -> str:
    env, rec = result["env"], result["recipe"]
    lines = [c for c in cells(result["rows"]) if schemes is None or c["scheme"] in schemes]
    md = [f"# anybit bench: {rec['name']}", ""]
    md.append(
        f"* {env.get('date')} · {env.get('gpu')} ({env.get('sm_count', '-')} SMs) · torch {env['torch']} · "
        f"triton {env['triton']} · CUDA {env.get('cuda', '-')} · anybit {env['anybit']} ({env['commit']})"
    )
    c = result.get("ceilings") or {}
    if c:
        md.append(
            f"* ceilings measured at the start: copy {c['copy_Bps'] / 1e12:.2f} TB/s, cuBLAS bf16 "
            f"{c['bf16_flops'] / 1e12:.0f} TFLOP/s"
            + (f", FP8 {c['fp8_flops'] / 1e12:.0f} TFLOP/s" if "fp8_flops" in c else "")
        )
    md.append(
        f"* recipe sha256 {env['recipe_sha256'][:16]}…, seed {env['seed']}; µs per call, CUDA-graph replay "
        f"for M ≤ {rec['graph_max_m']} else eager; median of {rec['repeats']} samples"
    )
    md += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    md += ["| " + " | ".join(r) + " |" for r in table_rows(lines)]
    md += [""] + [f"* {s}" for s in summary(lines)]
    md += [f"* skipped: {s}" for s in result.get("skipped", [])]
    return "\n".join(md) + "\n"


def plot(result: dict, path: str) -> str | None:
    """Time and % of floor against M, per scheme (one panel each) and backend; None if matplotlib is
    not installed (it is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    lines = [c for c in cells(result["rows"]) if c["us"]]
    schemes = sorted({c["scheme"] for c in lines})
    if not schemes:
        return None
    fig, axes = plt.subplots(2, len(schemes), figsize=(4 * len(schemes), 7), squeeze=False)
    for j, s in enumerate(schemes):
        for shape in sorted({c["shape"] for c in lines if c["scheme"] == s}):
            sel = sorted((c for c in lines if c["scheme"] == s and c["shape"] == shape), key=lambda c: c["m"])
            ms = [c["m"] for c in sel]
            axes[0][j].plot(ms, [c["us"] for c in sel], marker="o", label=f"anybit {shape}")
            if any(c["pct_floor"] for c in sel):
                axes[1][j].plot(ms, [c["pct_floor"] or 0 for c in sel], marker="o", label=shape)
            for p in ("humming", "torch-bf16"):
                if any(c[p] for c in sel):
                    axes[0][j].plot(ms, [c[p] or float("nan") for c in sel], ls="--", label=f"{p} {shape}")
        axes[0][j].set(title=s, xscale="log", yscale="log", ylabel="µs per call")
        axes[1][j].set(xscale="log", xlabel="M", ylabel="% of floor")
        axes[0][j].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "bench.json"), "markdown": os.path.join(out_dir, "bench.md")}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(result))
    png = plot(result, os.path.join(out_dir, "bench.png"))
    if png:
        paths["plot"] = png
    return paths


def _key(r: dict) -> tuple:
    return (r["shape"], r["n"], r["k"], r["scheme"], r["m"], r["backend"])


def compare(base: dict, new: dict, threshold: float) -> tuple[list[dict], bool]:
    """Per-cell ratios new/base for cells measured in both (eager and graph separately); regressed
    when a ratio exceeds 1 + threshold. Results of different GPUs or recipes are refused."""
    for what in ("gpu", "recipe_sha256"):
        if base["env"].get(what) != new["env"].get(what):
            raise AnybitError(
                f"refusing to compare: {what} differs ({base['env'].get(what)!r} vs "
                f"{new['env'].get(what)!r}); compare runs of one recipe on one kind of GPU"
            )
    old = {_key(r): r for r in base["rows"] if r.get("status") == "ok"}
    out, regressed = [], False
    for r in new["rows"]:
        b = old.get(_key(r))
        if b is None or r.get("status") != "ok":
            continue
        for mode in ("eager_us", "graph_us"):
            if mode in r and mode in b:
                ratio = r[mode] / b[mode]
                bad = ratio > 1 + threshold
                regressed |= bad
                out.append(
                    dict(
                        cell=" ".join(map(str, _key(r))),
                        mode=mode[:-3],
                        base=b[mode],
                        new=r[mode],
                        ratio=ratio,
                        regressed=bad,
                    )
                )
    return out, regressed
