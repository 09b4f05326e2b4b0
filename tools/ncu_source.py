"""Where a kernel's warps wait, per SASS instruction: reads the source page `tools/device.sh ncu` writes
($OUT/ncu_<tag>_sass.csv: `ncu -i REP --page source --print-source sass --csv`) and prints the stall reasons summed
over the kernel, then the instructions with the most warp-stall samples (their reasons, how often they ran).

    python tools/ncu_source.py FILE_sass.csv [--top 40] [--min-exec 0]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter


def _rows(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    head = next(i for i, r in enumerate(lines) if r and r[0] == "Address")
    return lines[head], [r for r in lines[head + 1 :] if len(r) == len(lines[head])]


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--min-exec", type=float, default=0, help="only instructions executed at least this often")
    ap.add_argument("--range", default="", help="A:B (hex offsets): every instruction between, in address order")
    args = ap.parse_args()
    head, rows = _rows(args.csv)
    col = {name: i for i, name in enumerate(head)}
    reasons = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    total = Counter()
    for r in rows:  # (the csv has no column for some reasons, e.g. a wgmma's: "other" is what the named leave)
        r.append(str(_num(r[col["Warp Stall Sampling (All Samples)"]]) - sum(_num(r[col[n]]) for n in reasons)))
        for n in reasons:
            total[n] += _num(r[col[n]])
        total["stall_other"] += _num(r[-1])
    col["stall_other"] = len(head)
    reasons.append("stall_other")
    samples = sum(total.values())
    print(f"{len(rows)} instructions, {samples:.0f} stall samples")
    for n, v in total.most_common(10):
        print(f"  {n[6:]:<16} {v:>8.0f}  {100 * v / max(samples, 1):5.1f} %")
    base = int(rows[0][col["Address"]], 16)
    hot = [r for r in rows if _num(r[col["Instructions Executed"]]) >= args.min_exec]
    if args.range:
        a, b = (int(v, 16) for v in args.range.split(":"))
        hot = [r for r in hot if a <= int(r[col["Address"]], 16) - base <= b]
    else:
        hot.sort(key=lambda r: -_num(r[col["Warp Stall Sampling (All Samples)"]]))
        hot = hot[: args.top]
    print(f"\n{'address':>6} {'samples':>7} {'executed':>9}  instruction  [top reasons]")
    for r in hot:
        why = sorted(((_num(r[col[n]]), n[6:]) for n in reasons), reverse=True)[:3]
        said = ", ".join(f"{name} {v:.0f}" for v, name in why if v)
        print(
            f"{int(r[col['Address']], 16) - base:>6x} {_num(r[col['Warp Stall Sampling (All Samples)']]):>7.0f} "
            f"{_num(r[col['Instructions Executed']]):>9.0f}  {r[col['Source']].strip()[:60]:<60} [{said}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
