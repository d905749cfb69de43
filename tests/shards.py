"""The fill of sharding.md recomputed independently in Python, and a check of dumped
shard files (`--dump DIR`) against it from the manifest alone."""
import bisect
import json
import math
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


# float8_e4m3fn's finite positive values, by code 0..126 (0x7f is NaN): exponent bias 7,
# subnormals below 2^-6. Written from the format's definition, not from Nereus's encoder.
E4M3 = [(c & 7) / 8 * 2.0 ** -6 if c >> 3 == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7) for c in range(127)]


def f32(x):
    """x rounded to float32 (struct packs a double by C's cast: round to nearest even). A
    float32 quotient or product computed in double and rounded once is the float32 one."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def e4m3_code(v):
    """A float32 value -> its e4m3fn byte: the nearest value, ties to the even code,
    saturating at 448; NaN -> 0x7f and ±inf -> ±448 with their sign (sharding.md)."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    if math.isnan(v):
        return sign | 0x7f
    a = min(abs(v), 448.0)
    hi = min(max(bisect.bisect_left(E4M3, a), 1), 126)
    lo = hi - 1
    dl, dh = a - E4M3[lo], E4M3[hi] - a
    code = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return sign | (126 if a >= E4M3[126] else code)


def fp8_expected(tensor, box, shape, block, scale=False):
    """What a dtype=fp8 unit holds of `box` of quantizable `tensor` (bf16 in the model):
    the fill of its param slot quantized per [bo, bi] block as sharding.md says — the
    FP8 bytes of `box`, or, with `scale`, the float32 scale_inv of the blocks of scale box
    `box`. Plain Python floats rounded to float32 at each step, as the rule does."""
    (bo, bi), (R, C) = block, shape
    if scale:
        sbox = box
        box = [[box[0][0] * bo, min(box[0][1] * bo, R)], [box[1][0] * bi, min(box[1][1] * bi, C)]]
    else:
        sbox = [[box[0][0] // bo, -(-box[0][1] // bo)], [box[1][0] // bi, -(-box[1][1] // bi)]]
    width = box[1][1] - box[1][0]
    q = bytearray((box[0][1] - box[0][0]) * width)
    scales = []
    floor = f32(1e-4)
    for br in range(*sbox[0]):
        for bc in range(*sbox[1]):
            rows, cols = [br * bo, min((br + 1) * bo, R)], [bc * bi, min((bc + 1) * bi, C)]
            raw = expected_bytes(tensor, "param", [rows, cols], C, 2)
            x = [struct.unpack("<f", b"\0\0" + raw[k:k + 2])[0] for k in range(0, len(raw), 2)]
            amax = max([abs(v) for v in x if math.isfinite(v)], default=0.0)
            s = f32((amax if amax > floor else floor) / 448.0)
            r = f32(1.0 / s)
            scales.append(s)
            n = cols[1] - cols[0]
            for i in range(max(rows[0], box[0][0]), min(rows[1], box[0][1])):
                for j in range(max(cols[0], box[1][0]), min(cols[1], box[1][1])):
                    v = x[(i - rows[0]) * n + (j - cols[0])]
                    y = v if math.isnan(v) else (math.copysign(448.0, v) if math.isinf(v) else f32(v * r))
                    q[(i - box[0][0]) * width + (j - box[1][0])] = e4m3_code(y)
    return struct.pack(f"<{len(scales)}f", *scales) if scale else bytes(q)


def model_shapes(nereus, name):
    rc = subprocess.run([nereus, "model", "--model", name, "--tensors", "--json"], capture_output=True, text=True)
    return {t["name"]: t["shape"] for t in json.loads(rc.stdout)["tensors"]}


def check_dump(nereus, d, model, sample=40):
    """Recomputes `sample` dumped files from the manifest alone."""
    shapes = model_shapes(nereus, model)
    block = json.loads(subprocess.run([nereus, "model", "--model", model, "--json"], capture_output=True, text=True).stdout)["fp8_block"]
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    files = manifest["files"]
    check(len(files) > 0, "dump lists files")
    step = max(1, len(files) // sample)
    ok = True
    for f in files[::step]:
        width = 4 if f["dtype"] == "f32" else 2
        data = open(os.path.join(d, f["file"]), "rb").read()
        parts = f.get("parts") or [{"tensor": f["tensor"], "box": f["box"]}]
        def expected(p):
            name = p["tensor"]
            if name.endswith(".weight_scale_inv"):  # an FP8 weight's block scales
                weight = name[:-len("_scale_inv")]
                return fp8_expected(weight, p["box"], shapes[weight], block, scale=True)
            if f["dtype"] == "f8_e4m3":
                return fp8_expected(name, p["box"], shapes[name], block)
            return expected_bytes(name, f["slot"], p["box"], shapes[name][1] if len(shapes[name]) > 1 else 1, width)
        want = b"".join(expected(p) for p in parts)
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
