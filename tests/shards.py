"""The fill of sharding.md recomputed independently in Python, and a check of dumped
shard files (`--dump DIR`) against it from the manifest alone."""
import json
import os
import struct
import subprocess
import sys

from harness import check


MASK64 = (1 << 64) - 1


def fnv1a64(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h ^= b
        h = (h * 0x100000001b3) & MASK64
    return h


def splitmix64(x):
    z = (x + 0x9e3779b97f4a7c15) & MASK64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    return z ^ (z >> 31)


def expected_bytes(tensor, slot, box, cols, width):
    """The fill of sharding.md for one box of a tensor with `cols` columns (1-d: cols=1)."""
    seed = fnv1a64(tensor + "/" + slot)
    out = bytearray()
    rows = box[0]
    cr = box[1] if len(box) > 1 else [0, 1]
    for i in range(rows[0], rows[1]):
        for j in range(cr[0], cr[1]):
            out += struct.pack("<Q", splitmix64(seed ^ (i * cols + j)))[:width]
    return bytes(out)


def fill_box(tensor, slot, box, cols, width):
    """expected_bytes() of a whole box at once (numpy's wrapping uint64 arithmetic): the
    same splitmix64 of the same indices, for buffers of megabytes."""
    import numpy as np
    u = np.uint64
    rows = np.arange(box[0][0], box[0][1], dtype=u)
    cr = box[1] if len(box) > 1 else [0, 1]
    z = u(fnv1a64(tensor + "/" + slot)) ^ (rows[:, None] * u(cols) + np.arange(cr[0], cr[1], dtype=u)[None, :]).reshape(-1)
    with np.errstate(over="ignore"):
        z = z + u(0x9e3779b97f4a7c15)
        z = (z ^ (z >> u(30))) * u(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> u(27))) * u(0x94d049bb133111eb)
        z = z ^ (z >> u(31))
    return z.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width].tobytes()


def model_shapes(nereus, name):
    rc = subprocess.run([nereus, "model", "--model", name, "--tensors", "--json"], capture_output=True, text=True)
    return {t["name"]: t["shape"] for t in json.loads(rc.stdout)["tensors"]}


def check_dump(nereus, d, model, sample=40):
    """Recomputes `sample` dumped files from the manifest alone."""
    shapes = model_shapes(nereus, model)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    files = manifest["files"]
    check(len(files) > 0, "dump lists files")
    step = max(1, len(files) // sample)
    ok = True
    for f in files[::step]:
        width = 4 if f["dtype"] == "f32" else 2
        data = open(os.path.join(d, f["file"]), "rb").read()
        parts = f.get("parts") or [{"tensor": f["tensor"], "box": f["box"]}]
        want = b"".join(expected_bytes(p["tensor"], f["slot"], p["box"],
                                       shapes[p["tensor"]][1] if len(shapes[p["tensor"]]) > 1 else 1, width)
                        for p in parts)
        if data != want:
            ok = False
            print("dump mismatch:", f["file"], file=sys.stderr)
            break
    check(ok, f"dumped shards of {model} match the fill recomputed from the manifest")
    check(any("parts" in f for f in files) or not any("qkv" in f["file"] for f in files), "fused buffers list their parts")


def expert_holders(experts, tp, pp_stage_devices, ep=1, etp=None):
    """sharding.md's expert rule for one pipeline stage whose GPUs (in R order, tp·ep of
    them) are `pp_stage_devices`: {expert: {device: expert rank}}."""
    etp = etp or tp
    groups = tp * ep // etp
    out = {}
    for g, dev in enumerate(pp_stage_devices):
        q, t = divmod(g, etp)
        lo, hi = q * experts // groups, (q + 1) * experts // groups
        for x in range(lo, hi):
            out.setdefault(x, {})[dev] = t
    return out
