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
from fp8_torch import dequantize, element_scales, within_rounding  # noqa: E402
from shards import fill_box, model_shapes  # noqa: E402

NEREUS = sys.argv[1]
MODEL = "tiny-deepseek-v3"

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
        deq = dequantize(q, s, f["box"], block)
        cols_total = shapes[f["tensor"]][1]
        src = torch.frombuffer(bytearray(fill_box(f["tensor"], "param", f["box"], cols_total, 2)), dtype=torch.bfloat16)
        x = src.reshape(r1 - r0, c1 - c0).double()
        ok, w = within_rounding(deq, x, element_scales(s, f["box"], block))
        check(ok, f"{name}: dequantized within FP8's rounding of the bf16 source")
        compared += 1
        worst = max(worst, w)
    check(compared > 10, f"FP8 shards compared ({compared}; worst error {worst:.2f} of the bound)")

finish("fp8-torch")
