"""The `anybit` command."""

from __future__ import annotations

import argparse
import sys

import anybit

RECIPE_HELP = (
    "recipe YAML, or a shipped recipe by name: default (Llama-3-8B layers, when left out), dense_a16, fp8, moe"
)


def _formats(args: argparse.Namespace) -> int:
    from anybit.tools.formats import print_formats

    print_formats(group_size=args.group_size, k=args.k)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from anybit.tools.explain import explain_lines

    try:
        m, n, k = (int(v) for v in args.shape.split(","))
        moe = [int(v) for v in args.moe.split(",")] if args.moe else None
        if moe is not None and len(moe) != 2:
            raise ValueError
    except ValueError:
        what = "--moe E,TOPK and --shape TOKENS,H,I" if args.moe else "--shape M,N,K"
        raise anybit.AnybitError(f"{what}: give integers, e.g. --shape 16,8192,8192 or --moe 256,8") from None
    if moe:
        from anybit.tools.explain import moe_lines

        print("\n".join(moe_lines(args.scheme, *moe, m, n, k, args.device, args.dtype)))
    else:
        print("\n".join(explain_lines(args.scheme, m, n, k, args.device, args.dtype)))
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    from anybit.bench.recipe import load_recipe

    if args.compare:
        from anybit.bench.report import compare

        base, new = (json.load(open(p)) for p in args.compare)
        threshold = float(args.threshold.rstrip("%")) / (100 if args.threshold.endswith("%") else 1)
        rows, regressed = compare(base, new, threshold)
        for r in rows:
            flag = "REGRESSED" if r["regressed"] else ""
            print(f"{r['cell']:60s} {r['mode']:5s} {r['base']:10.2f} -> {r['new']:10.2f} µs  {r['ratio']:.3f}x {flag}")
        n_bad = sum(r["regressed"] for r in rows)
        print(f"{len(rows)} cells compared, {n_bad} regressed past {threshold:.1%}")
        return 1 if regressed else 0
    if args.report:
        from anybit.bench.report import markdown

        with open(args.report) as f:
            print(markdown(json.load(f), schemes=args.schemes.split(",") if args.schemes else None), end="")
        return 0
    from anybit.bench.main import run_bench

    recipe = _with_overrides(load_recipe(args.recipe), args)
    run_bench(recipe, out_dir=args.out, device=args.device)
    return 0


def _eval(args: argparse.Namespace) -> int:
    import json
    import os

    from anybit.bench.evaluate import INPUTS, evaluate, evaluate_checkpoint, summary, table
    from anybit.bench.recipe import load_recipe
    from anybit.bench.report import print_rows

    kinds = args.inputs.split(",")
    bad = [k for k in kinds if k not in INPUTS]
    if bad:
        raise anybit.AnybitError(f"--inputs {bad}: valid kinds are {list(INPUTS)}")
    if args.checkpoint:
        if args.recipe or args.schemes or args.shapes:
            raise anybit.AnybitError("--checkpoint evaluates the checkpoint's own layers: give no recipe, --schemes "
                                     "or --shapes with it")  # fmt: skip
        backends = (args.backends or "auto").split(",")
        result = evaluate_checkpoint(args.checkpoint, backends, kinds, m=args.rows, device=args.device)
        title, out = f"anybit eval — {args.checkpoint}: each layer's error against its exact product", args.out
    else:
        recipe = _with_overrides(load_recipe(args.recipe), args)
        if args.backends:
            recipe.backends = args.backends.split(",")
        result = evaluate(recipe, kinds, m=args.rows, device=args.device)
        title, out = f"anybit eval — {recipe.name}: relative error against the float layer", args.out or recipe.out
    header, lines = table(result)
    print_rows(title, header, lines)
    for s in summary(result):
        print(s)
    out = out or "eval-out"
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "eval.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)
    return 1 if any(r.get("status") == "WRONG" for r in result["rows"]) else 0


def _tune(args: argparse.Namespace) -> int:
    from anybit.bench.recipe import load_recipe
    from anybit.tuning.tune import print_rows, run_tune

    recipe = _with_overrides(load_recipe(args.recipe), args)
    rows = run_tune(recipe, device=args.device, backends=args.backends.split(","), write_to=args.write_table)
    print_rows(rows)
    from anybit.backends.triton import tuning_cache

    print("tuning cache:", tuning_cache(__import__("torch").device(args.device or "cuda")).path)
    return 0


def _with_overrides(recipe, args: argparse.Namespace):
    """The recipe with the command line's --schemes / --shapes / --m / --budget applied."""
    from anybit.bench.recipe import parse_recipe

    d = _as_input(recipe)
    override = {}
    if args.schemes:
        override["schemes"] = args.schemes.split(",")
    if getattr(args, "shapes", None):
        names = args.shapes.split(",")
        unknown = set(names) - {s["name"] for s in d["shapes"]}
        if unknown:
            raise anybit.AnybitError(f"--shapes {sorted(unknown)}: the recipe has {[s['name'] for s in d['shapes']]}")
        override["shapes"] = [s for s in d["shapes"] if s["name"] in names]
    if getattr(args, "m", None):
        override["m"] = [int(v) for v in args.m.split(",")]
    if getattr(args, "budget", None):
        override["budget_s"] = args.budget
    return parse_recipe({**d, **override}, recipe.source) if override else recipe


def _as_input(recipe) -> dict:
    """A parsed recipe as parse_recipe's input again (shapes explicit)."""
    d = recipe.to_dict()
    d["shapes"] = [dict(s) for s in d["shapes"]]
    return d


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anybit", description="Quantized GEMM kernels and their tools.")
    parser.add_argument("--version", action="version", version=f"anybit {anybit.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="list weight dtypes and presets with their sizes and ranges")
    f.add_argument("--group-size", type=int, default=128, help="group size for the bytes/weight column")
    f.add_argument("--k", type=int, default=4096, help="K for per-channel presets' effective size")
    f.set_defaults(func=_formats)
    e = sub.add_parser("explain", help="which backends can run a problem here, why not, and what auto picks")
    e.add_argument("--scheme", required=True, help="a scheme or preset, e.g. w4a16, nvfp4, w8a8-fp8")
    e.add_argument("--shape", required=True, help="M,N,K of x[M,K] @ W[N,K]^T, e.g. 16,8192,8192; --moe: TOKENS,H,I")
    e.add_argument("--moe", default=None, help="E,TOPK: one QuantMoE layer, e.g. 256,8 --shape 4096,7168,2048")
    e.add_argument("--device", default=None, help="cuda, cpu (default: cuda when there is one)")
    e.add_argument("--dtype", default="bf16", help="activation dtype: bf16 or fp16")
    e.set_defaults(func=_explain)
    b = sub.add_parser("bench", help="time every backend and peer on a recipe's shapes (default: Llama-3-8B)")
    b.add_argument("recipe", nargs="?", default=None, help=RECIPE_HELP)
    b.add_argument("--out", default=None, help="output directory (default: the recipe's `out`)")
    b.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when there is one)")
    b.add_argument("--compare", nargs=2, metavar=("BASE", "NEW"), help="compare two bench.json files")
    b.add_argument("--threshold", default="5%", help="regression threshold for --compare (default 5%%)")
    b.add_argument("--budget", type=float, default=None, help="seconds before remaining cells are skipped")
    b.add_argument("--report", metavar="BENCH_JSON", help="print the Markdown summary of a bench.json")
    b.add_argument("--schemes", default=None, help="only these schemes (comma-separated): the run's, or --report's")
    b.add_argument("--shapes", default=None, help="only these recipe shapes (comma-separated names)")
    b.add_argument("--m", default=None, help="only these M (comma-separated)")
    b.set_defaults(func=_bench)
    v = sub.add_parser("eval", help="each scheme's error against the float layer, anybit's beside its peers'")
    v.add_argument("recipe", nargs="?", default=None, help=RECIPE_HELP)
    v.add_argument("--schemes", default=None, help="only these schemes (comma-separated)")
    v.add_argument("--shapes", default=None, help="only these recipe shapes (comma-separated names)")
    v.add_argument("--m", dest="rows", type=int, default=None, help="rows of x a cell uses (default 64)")
    v.add_argument("--inputs", default="gaussian,outliers", help="input kinds: gaussian, outliers (LLM-like)")
    v.add_argument("--backends", default=None, help="anybit backends (default: the recipe's, e.g. auto)")
    v.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when there is one)")
    v.add_argument("--checkpoint", default=None, metavar="DIR", help="a quantized checkpoint instead of a recipe: "
                   "each layer's anybit output against its exact product")  # fmt: skip
    v.add_argument("--out", default=None, help="output directory for eval.json (default: the recipe's `out`)")
    v.set_defaults(func=_eval)
    t = sub.add_parser("tune", help="measure tiles and backends for a recipe's problems into the tuning cache")
    t.add_argument("recipe", nargs="?", default=None, help=RECIPE_HELP)
    t.add_argument("--schemes", default=None, help="only these schemes (comma-separated)")
    t.add_argument("--shapes", default=None, help="only these recipe shapes (comma-separated names)")
    t.add_argument("--m", default=None, help="only these M (comma-separated), e.g. 1,16,64")
    t.add_argument("--backends", default="triton,humming", help="backends to time (default: triton,humming)")
    t.add_argument("--device", default=None, help="cuda, cuda:1 (default: cuda)")
    t.add_argument("--budget", type=float, default=None, help="seconds before remaining problems are skipped")
    t.add_argument("--write-table", default=None, metavar="DIR", help="also copy the cache file under DIR")
    t.set_defaults(func=_tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except anybit.AnybitError as e:
        print(f"anybit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
