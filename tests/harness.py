"""Counting checks for the Python test scripts: check() records, finish() prints the
closing 'N passed, N failed' line and exits non-zero on any failure. NEREUS_CHECKS_VERBOSE=1
prints every passing check too (their texts carry the measured figures)."""
import json
import os
import re
import shutil
import subprocess
import sys
import zlib

_failures = []
_passed = 0


def check(cond, what):
    global _passed
    if cond:
        _passed += 1
        if os.environ.get("NEREUS_CHECKS_VERBOSE"):
            print("ok:", what, file=sys.stderr)
    else:
        _failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def finish(name):
    print(f"{name}: {_passed} passed, {len(_failures)} failed")
    sys.exit(1 if _failures else 0)


def check_perfetto(path, processes):
    """A Perfetto (Chrome trace event) file: valid JSON, `processes` named processes,
    complete events with durations >= 0 that nest per track. Returns the complete events."""
    j = json.load(open(path))
    events = j.get("traceEvents", [])
    names = [e for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    check(len(names) == processes, f"perfetto: {processes} named processes ({len(names)})")
    tracks = {}
    xs = [e for e in events if e.get("ph") == "X"]
    for e in events:
        if e.get("ph") == "X":
            check(e.get("dur", -1) >= 0 and e.get("ts", -1) >= 0, f"perfetto: complete event with ts, dur >= 0: {e}")
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    check(len(tracks) >= processes, "perfetto: tracks with events")
    for key, spans in tracks.items():
        spans.sort()
        stack = []
        for begin, end in spans:
            while stack and stack[-1] <= begin + 1e-3:
                stack.pop()
            ok = not stack or end <= stack[-1] + 1e-3
            if not ok:
                check(False, f"perfetto: events overlap without nesting on track {key}")
                break
            stack.append(end)
    return xs


def png_pixels(path):
    """The raw scanlines of a PNG (filter bytes included): enough to tell a blank picture."""
    data = open(path, "rb").read()
    pos, idat = 8, b""
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


def check_plot(svg, labels):
    """An SVG plot: its title lines fit, its labels are there, and rasterised it is not blank."""
    text = open(svg).read()
    titles = re.findall(r'font-size="15">([^<]*)<', text)
    check(titles and all(len(t) <= 110 for t in titles), f"the plot's title fits its width ({titles})")
    for label in labels:
        check(label in text, f"the plot's legend names {label}")
    if shutil.which("rsvg-convert") is None:
        print("cli: rsvg-convert not installed (librsvg2-bin): the plot is not rasterised")
        return
    png = svg + ".png"
    r = subprocess.run(["rsvg-convert", "-o", png, svg], capture_output=True, text=True)
    check(r.returncode == 0, f"rsvg-convert renders the plot ({r.stderr.strip()})")
    if r.returncode == 0:
        pixels = png_pixels(png)
        ink = sum(1 for b in pixels[::7] if b < 200)
        check(ink > len(pixels[::7]) // 200, f"the rendered plot is not blank ({ink} dark samples of {len(pixels[::7])})")
