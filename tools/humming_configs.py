"""Print the tile configuration Humming's own heuristics choose for dense W4A16 (or another weight dtype) layers, per
token count — what our kernels are compared against (block shape, warp shape, stages, stream-K / split), on the device:

    bash tools/device.sh py tools/humming_configs.py --shapes 28672x8192,8192x8192 --m 64,128,256 [--dtype uint4]

Writes $OUT/humming_configs.json when OUT is set."""

from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="28672x8192,4096x14336,8192x8192")
    p.add_argument("--m", default="64,96,128,256")
    p.add_argument("--dtype", default="uint4")
    p.add_argument("--group", type=int, default=128)
    a = p.parse_args()
    from humming.layer import HummingLayer, HummingLayerMethod
    from humming.tune import get_heuristics_config

    rows = []
    for shape in a.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        layer = HummingLayer(
            shape_n=n,
            shape_k=k,
            weight_config={"dtype": a.dtype, "group_size": a.group},
            input_config=None,
            torch_dtype=torch.bfloat16,
        ).cuda()
        layer.load_from_unquantized(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
        layer.transform()  # (the layer's meta exists from here on)
        meta = HummingLayerMethod._get_meta(layer, "")
        for m in (int(v) for v in a.m.split(",")):
            cfg = get_heuristics_config(meta, shape_m=m, device=torch.device("cuda"))
            text = repr(cfg)
            rows.append(dict(shape=shape, m=m, config=text))
            print(f"{shape:>11} M={m:<5} {text}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "humming_configs.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
