"""e4m3fn decoded from its definition, and a block-scaled FP8 weight box dequantized, for
the tests that read FP8 bytes through torch (Debian's torch has no float8 type: the bytes
arrive as torch.uint8, the scales as torch.float32)."""
import torch

# e4m3fn: code -> value (bias 7, subnormals below 2^-6, 0x7f/0xff NaN).
_codes = torch.arange(256)
_e, _m = (_codes >> 3) & 15, (_codes & 7).double()
_mag = torch.where(_e == 0, _m / 8 * 2.0 ** -6, (1 + _m / 8) * torch.pow(2.0, (_e - 7).double()))
DECODE = torch.where(_codes & 0x80 != 0, -_mag, _mag)
DECODE[(_codes & 0x7f) == 0x7f] = float("nan")


def element_scales(scales, box, block):
    """Each element's scale_inv (float64) for a weight box whose scale box starts at the
    box's first block."""
    (r0, r1), (c0, c1) = box
    rows = (torch.arange(r0, r1) // block[0] - r0 // block[0])[:, None]
    cols = (torch.arange(c0, c1) // block[1] - c0 // block[1])[None, :]
    return scales[rows, cols].double()


def dequantize(q, scales, box, block):
    """The float64 values of FP8 bytes `q` (uint8, the box's shape) times their blocks' scales."""
    return DECODE[q.long()] * element_scales(scales, box, block)


def within_rounding(deq, x, s):
    """Whether dequantized `deq` is the source `x` within FP8's rounding: half a step of
    e4m3's 3-bit mantissa (2^-4 relative), or, in its subnormal range, half of its
    smallest step (2^-10) in units of the scale `s`; NaN stays NaN and ±inf saturates to
    ±448 times the scale. Returns (ok, worst error as a fraction of the bound)."""
    finite = torch.isfinite(x)
    err = (deq - x).abs()
    bound = torch.maximum(x.abs() * 2.0 ** -4, s * 2.0 ** -10) * (1 + 1e-6)
    ok = bool((err[finite] <= bound[finite]).all())
    ok = ok and bool(torch.isnan(deq[torch.isnan(x)]).all())
    inf = torch.isinf(x)
    ok = ok and bool((deq[inf] == torch.sign(x[inf]) * 448 * s[inf]).all())
    worst = float((err[finite] / bound[finite]).max()) if bool(finite.any()) else 0.0
    return ok, worst
