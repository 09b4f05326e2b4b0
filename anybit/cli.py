"""The `anybit` command."""

from __future__ import annotations

import argparse
import sys

import anybit


def _formats(args: argparse.Namespace) -> int:
    from anybit.tools.formats import print_formats

    print_formats(group_size=args.group_size, k=args.k)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anybit", description="Quantized GEMM kernels and their tools.")
    parser.add_argument("--version", action="version", version=f"anybit {anybit.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="list weight dtypes and presets with their sizes and ranges")
    f.add_argument("--group-size", type=int, default=128, help="group size for the bytes/weight column")
    f.add_argument("--k", type=int, default=4096, help="K for per-channel presets' effective size")
    f.set_defaults(func=_formats)
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
