"""An FP8 unit after a bf16 -> FP8 weight sync, read the way a PyTorch user reads it: the
dumped shards as torch.uint8 (Debian's torch has no float8 type) and their scales as
torch.float32, dequantized here (e4m3fn decoded from its definition, times each block's
scale_inv) and compared with the bf16 source within FP8's rounding. Run by meson with
Debian's python3 and python3-torch."""
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, finish  # noqa: E402
from shards import fill_box, model_shapes  # noqa: E402

NEREUS = sys.argv[1]
MODEL = "tiny-deepseek-v3"

# e4m3fn: code -> value (bias 7, subnormals below 2^-6, 0x7f/0xff NaN).
codes = torch.arange(256)
e, m = (codes >> 3) & 15, (codes & 7).double()
mag = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
DECODE = torch.where(codes & 0x80 != 0, -mag, mag)
DECODE[(codes & 0x7f) == 0x7f] = float("nan")

with tempfile.TemporaryDirectory() as d:
    p = subprocess.run([NEREUS, "bench", "transition", "--model", MODEL, "--sync", "--from", "tp=1,pp=1,dp=1",
                        "--to", "tp=2,pp=1,dp=1,devices=1-2,dtype=fp8", "--repeat", "1", "--dump", d, "--json"],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"bf16 -> FP8 sync with --dump ({p.stderr.strip()[-300:]})")
    shapes = model_shapes(NEREUS, MODEL)
    block = json.loads(subprocess.run([NEREUS, "model", "--model", MODEL, "--json"], capture_output=True, text=True).stdout)["fp8_block"]
    files = {f["file"]: f for f in json.load(open(os.path.join(d, "manifest.json")))["files"]}
    compared, worst = 0, 0.0
    for name, f in files.items():
        if f["dtype"] != "f8_e4m3":
            continue
        scale_file = files[name.replace(".weight@param.bin", ".weight_scale_inv@param.bin")]
        (r0, r1), (c0, c1) = f["box"]
        q = torch.frombuffer(bytearray(open(os.path.join(d, name), "rb").read()), dtype=torch.uint8).reshape(r1 - r0, c1 - c0)
        s = torch.frombuffer(bytearray(open(os.path.join(d, scale_file["file"]), "rb").read()), dtype=torch.float32)
        s = s.reshape(scale_file["box"][0][1] - scale_file["box"][0][0], -1)
        # Each element's scale: its block's, the scale box starting at the weight box's first block.
        rows = (torch.arange(r0, r1) // block[0] - r0 // block[0])[:, None]
        cols = (torch.arange(c0, c1) // block[1] - c0 // block[1])[None, :]
        deq = DECODE[q.long()] * s[rows, cols].double()
        cols_total = shapes[f["tensor"]][1]
        src = torch.frombuffer(bytearray(fill_box(f["tensor"], "param", f["box"], cols_total, 2)), dtype=torch.bfloat16)
        x = src.reshape(r1 - r0, c1 - c0).double()
        finite = torch.isfinite(x)
        # Within FP8's rounding: half a step of e4m3's 3-bit mantissa (2^-4 relative), or, in
        # its subnormal range, half of its smallest step (2^-10) in units of the scale.
        err = (deq - x).abs()
        bound = torch.maximum(x.abs() * 2.0 ** -4, s[rows, cols].double() * 2.0 ** -10) * (1 + 1e-6)
        ok = bool((err[finite] <= bound[finite]).all())
        # NaN stays NaN; ±inf saturates to ±448 times the scale.
        ok = ok and bool(torch.isnan(deq[torch.isnan(x)]).all())
        inf = torch.isinf(x)
        ok = ok and bool((deq[inf] == torch.sign(x[inf]) * 448 * s[rows, cols].double().expand_as(x)[inf]).all())
        check(ok, f"{name}: dequantized within FP8's rounding of the bf16 source")
        compared += 1
        worst = max(worst, float((err[finite] / bound[finite]).max()))
    check(compared > 10, f"FP8 shards compared ({compared}; worst error {worst:.2f} of the bound)")

finish("fp8-torch")
