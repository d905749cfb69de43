#!/usr/bin/python3
"""Draws a Perfetto/Chrome trace (as examples/rlhf/ppo.py --perfetto writes it) as an SVG
timeline: one row per track, one bar per complete event, stage work and transition work
in different colours. For docs pictures; ui.perfetto.dev shows the same file interactively.

Usage: trace_svg.py TRACE.json OUT.svg [--steps FIRST:LAST] [--title TEXT]
"""
import argparse
import html
import json

STAGE_COLOURS = {"actor/generate": "#4e79a7", "actor/infer": "#59a14f", "reference/infer": "#8cd17d",
                 "critic/infer": "#76b7b2", "actor/train": "#e15759", "critic/train": "#ff9d9a"}
TRANSITION_COLOUR, STEP_COLOUR = "#f28e2b", "#bab0ac"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--steps", help="FIRST:LAST: only the time of these steps")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    bars = [e for e in events if e["ph"] == "X"]
    lo, hi = min(e["ts"] for e in bars), max(e["ts"] + e["dur"] for e in bars)
    if a.steps:
        first, last = (int(x) for x in a.steps.split(":"))
        window = [e for e in bars if names[e["tid"]] == "steps" and first <= e["args"]["step"] <= last]
        lo, hi = min(e["ts"] for e in window), max(e["ts"] + e["dur"] for e in window)
    bars = [e for e in bars if e["ts"] + e["dur"] > lo and e["ts"] < hi]
    tids = sorted({e["tid"] for e in bars})
    left, width, row, top = 170, 900, 20, 40 if a.title else 16
    scale = width / max(hi - lo, 1.0)
    height = top + row * len(tids) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="100%" height="100%" fill="white"/>']
    if a.title:
        out.append(f'<text x="{left}" y="22" font-size="14">{html.escape(a.title)}</text>')
    for i, tid in enumerate(tids):
        y = top + i * row
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{html.escape(names.get(tid, str(tid)))}</text>')
        out.append(f'<line x1="{left}" x2="{left + width}" y1="{y + row}" y2="{y + row}" stroke="#eee"/>')
    for e in bars:
        y = top + tids.index(e["tid"]) * row
        x0 = left + (max(e["ts"], lo) - lo) * scale
        x1 = left + (min(e["ts"] + e["dur"], hi) - lo) * scale
        track = names.get(e["tid"], "")
        colour = STEP_COLOUR if track == "steps" else TRANSITION_COLOUR if "transition" in track else \
            STAGE_COLOURS.get(e["name"], "#999")
        label = html.escape(e["name"])
        out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 0.8):.1f}" height="{row - 6}" fill="{colour}">'
                   f'<title>{label}</title></rect>')
        if x1 - x0 > 7 * len(e["name"]):
            out.append(f'<text x="{x0 + 3:.1f}" y="{y + 14}" fill="white">{label}</text>')
    y = top + row * len(tids) + 16
    seconds = (hi - lo) / 1e6
    tick = next(t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if seconds / t <= 10)
    t = 0.0
    while t <= seconds + 1e-9:
        x = left + t * 1e6 * scale
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 6}" y2="{y}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 12}" text-anchor="middle">{t:g} s</text>')
        t += tick
    legend = list(STAGE_COLOURS.items()) + [("transition: build / free of a unit", TRANSITION_COLOUR)]
    x = left
    for name, colour in legend:
        out.append(f'<rect x="{x}" y="{y + 22}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 31}">{html.escape(name)}</text>')
        x += 14 + 6.5 * len(name) + 12
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
