"""Fold a tuning table written on the device (`anybit tune --write-table`) into the shipped one.

    python tools/merge_table.py NEW.json [--drop SCHEME,...] [--table anybit/tuning/tables/<gpu>/gemm-<hash>.json]

Entries of NEW replace the shipped ones with the same key; --drop removes every entry of those schemes
first (rows tuned for a kernel that no longer runs them). The shipped table defaults to the only one
under anybit/tuning/tables/ for NEW's device folder.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("--drop", default="", help="schemes whose shipped rows go first, comma-separated")
    ap.add_argument("--table", default=None)
    args = ap.parse_args()
    root = os.path.join(os.path.dirname(__file__), "..", "anybit", "tuning", "tables")
    gpu = os.path.basename(os.path.dirname(os.path.abspath(args.new)))
    tables = [args.table] if args.table else glob.glob(os.path.join(root, gpu, "gemm-*.json"))
    if len(tables) != 1:
        print(f"need exactly one shipped table for {gpu}, found {tables}: pass --table")
        return 2
    with open(tables[0]) as f:
        shipped = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    drop = tuple(s + "|" for s in args.drop.split(",") if s)
    before = len(shipped["entries"])
    entries = {k: v for k, v in shipped["entries"].items() if not k.startswith(drop)} if drop else shipped["entries"]
    dropped = before - len(entries)
    entries.update(new["entries"])
    shipped["entries"] = entries
    with open(tables[0], "w") as f:
        json.dump(shipped, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{tables[0]}: {dropped} dropped, {len(new['entries'])} merged, {len(entries)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
