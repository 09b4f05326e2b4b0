"""The warp-specialised large-M A16 kernel (`anybit.kernels.frag_ws`: 4-bit integer or e2m1 weights) against what
it replaces and its peers, one GPU call: dequantize-then-cuBLAS, cuBLAS bf16 on a weight dequantized once (the
ceiling a fused kernel aims at), anybit's own route for the call, and Humming on the same float weight.

    python tools/probe_ws.py [--shapes 8192x8192,28672x8192,8192x28672] [--m 256,1024,4096,8192]
                             [--tiles "stages=4;stages=3;block_n=128"] [--peers humming] [--out DIR]

Every variant is first checked against the exact product (a float64 reference of a few rows from
`dequantize()`) and relaunched bit for bit; then eager CUDA-event medians over weight copies that do not
fit L2 together. Prints µs and TF/s per cell, writes DIR/probe_ws.json.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import humming_peers, probe_parser, relaunch_check, tile_overrides, time_cells, write_probe  # noqa: E402

from anybit import quantize  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.backends.base import Prepared  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.frag_dequant import dequantize_frag  # noqa: E402
from anybit.kernels.frag_rs import frag_rs_why_not, gemm_frag_rs, rs_block_m, ws_int_why_not  # noqa: E402
from anybit.kernels.frag_rsp import gemm_frag_rsp, gemm_frag_rsw, rsw_block_m  # noqa: E402
from anybit.kernels.frag_ws import frag_ws_weight_why_not, gemm_frag_ws, swap_block_m, ws_tile  # noqa: E402


def _tiles(text: str) -> list[dict]:
    """ "stages=4;default;rs=1" -> the tiles, "default" (or nothing at all) the kernel's own (`ws_tile`)."""
    out = []
    for part in filter(None, text.split(";")):
        out.append({} if part == "default" else tile_overrides(part))
    return out or [{}]


def main() -> int:
    ap = probe_parser(__doc__, "w4a16", "256,512,1024,2048,4096,8192", "stages=4;stages=3", "humming",
                      "humming, route (anybit's own path for the call), nocublas (no dequantize + cuBLAS cells), "
                      "none; tiles swap=1:block_m=0 take the fewest tokens holding M, default the kernel's own, "
                      "rs=1:block_m=128 the register-operand kernel (rs=1:diag=1: no decode, timing; "
                      "rs=1:persistent=1 its persistent stream-K form, rs=1:wide=1 the wide one: 128-row "
                      "tiles)")  # fmt: skip
    args = ap.parse_args()
    dev = torch.device("cuda")
    scheme = Scheme.parse(args.scheme)
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        ws_list, qws, humm = [], [], None
        for _ in range(args.copies):
            w = torch.randn(n, k, device=dev) * 0.02
            qws.append(quantize(w, scheme))
            ws_list.append(w)
        tws = [to_triton_layout(qw, allow_frag3=True) for qw in qws]  # (as the dense backend lays them out)
        ws_why = frag_ws_weight_why_not(tws[0], torch.bfloat16, dev)
        if ws_why:  # (zero points, 2/3-bit codes, other-dtype scales: its row-major tiles unless ANYBIT_WS_INT=0)
            ws_why = ws_int_why_not(scheme, k, n, torch.bfloat16, dev) and ws_why
        rs_why = frag_rs_why_not(tws[0], torch.bfloat16, dev)  # (zero points, 3-bit codes: this kernel alone)
        if ws_why or rs_why:  # the other cells still run
            errors[shape] = f"warp-specialised: {ws_why}; register-operand: {rs_why}"
        wdeq = [dequantize_frag(tw, dtype=torch.bfloat16) for tw in tws]
        humm = humming_peers(ws_list, scheme, args.peers, errors, shape)
        del ws_list
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            ref = x[:64].double() @ qws[0].dequantize().double().T
            cells = {}
            if "nocublas" not in args.peers:
                cells["dequant+cublas"] = [
                    lambda tw=tw, x=x: torch.nn.functional.linear(x, dequantize_frag(tw, dtype=x.dtype)) for tw in tws
                ]  # fmt: skip
                cells["cublas-bf16 (W dequantized once)"] = [lambda wd=wd, x=x: torch.nn.functional.linear(x, wd)
                                                             for wd in wdeq]  # fmt: skip
            if humm:
                cells["humming"] = [lambda h=h, x=x: h(x) for h in humm]
            if "route" in args.peers:  # what anybit.gemm does for this call (the Triton backend's route)
                preps = [Prepared("triton", qw, tw) for qw, tw in zip(qws, tws, strict=True)]
                why = relaunch_check(lambda x=x, p=preps[0]: get_backend("triton").gemm(x, p), ref)
                if why is None:
                    cells["route"] = [lambda p=p, x=x: get_backend("triton").gemm(x, p) for p in preps]
                else:
                    errors[f"route {shape} M={m}"] = why
            for tile in _tiles(args.tiles):
                if rs_why if tile.get("rs") else ws_why:
                    continue
                name = "ws " + (":".join(f"{a}={b}" for a, b in tile.items()) or "default")
                if tile.get("rs"):  # the register-operand kernel (`frag_rs`): its own options only; persistent=1
                    t = {a: b for a, b in tile.items() if a not in ("rs", "persistent", "wide")}  # and wide=1: its
                    fn = gemm_frag_rs  # persistent stream-K forms
                    fn = gemm_frag_rsw if tile.get("wide") else gemm_frag_rsp if tile.get("persistent") else fn
                else:
                    bits = scheme.weight.bits  # (even where auto says no)
                    fn, t = gemm_frag_ws, (ws_tile(m, n, bits=bits) or ws_tile(1024, 8192, bits=bits)) | tile
                if t.get("swap") and not t.get("block_m"):  # 0: the fewest tokens holding M
                    t["block_m"] = swap_block_m(m) or 256
                if tile.get("rs") and not t.get("block_m"):  # 0: the kernel's token tile (`rs_block_m`; the wide
                    t["block_m"] = rs_block_m(m, n) or 128  # form's up to 192, `rsw_block_m`)
                    if tile.get("wide"):
                        t["block_m"] = rsw_block_m(t["block_m"])
                try:
                    why = relaunch_check(lambda fn=fn, t=t, x=x, tw=tws[0]: fn(x, tw, **t), ref)
                    if why is not None and not t.get("diag"):  # diag variants time wrong results
                        errors[f"{name} {shape} M={m}"] = why
                        continue
                    cells[name] = [lambda fn=fn, tw=tw, t=t, x=x: fn(x, tw, **t) for tw in tws]
                except Exception as ex:
                    errors[f"{name} {shape} M={m}"] = f"{type(ex).__name__}: {str(ex)[:400]}"
            rows += time_cells(cells, n, k, m, args.graph)
    print(write_probe(args.out, "probe_ws", rows, errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
