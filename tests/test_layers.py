#!/usr/bin/env python3
"""The layer rule of docs/architecture.md: a folder of include/nereus/ or src/ includes
only itself and the folders its diagram lets it include: the diagram's arrows (read from
the doc itself, so the two cannot drift apart) point from a layer to a layer that may
include it, and a layer may include every layer it is reached from. So transport may not
include control, nor sim runtime, though both rank lower; and no include cycle can form.
Also checks that tests/all_headers.cpp includes every public header, so one translation
unit compiles them all together (one name per concept across the public API)."""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def allowed_edges(root):
    """{layer: the layers it may include}, from the first mermaid `flowchart BT` of
    docs/architecture.md: `a --> b --> c` and `a --> b & c` chains."""
    text = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
    m = re.search(r"```mermaid\nflowchart BT\n(.*?)```", text, re.S)
    if not m:
        raise SystemExit("FAIL docs/architecture.md has no `flowchart BT` diagram of the layers")
    below = {}
    for line in m.group(1).splitlines():
        groups = [[x.strip() for x in part.split("&")] for part in line.split("-->")]
        for names in groups:
            for n in names:
                below.setdefault(n, set())
        for lo, hi in zip(groups, groups[1:]):
            for a in lo:
                for b in hi:
                    below[b].add(a)
    # A layer may include what it is reached from, directly or not.
    closed = {}
    for layer in below:
        seen, todo = set(), list(below[layer])
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                todo += below[x]
        closed[layer] = seen
    return closed


def layer_of_include(src_root, folder, path, inc):
    if inc.startswith("nereus/"):
        return inc.split("/")[1]
    if inc.startswith("../"):
        return os.path.normpath(os.path.join(folder, inc)).split(os.sep)[0]
    return None


def main(root):
    problems = []
    seen = 0
    may = allowed_edges(root)
    for base in ("include/nereus", "src"):
        top = os.path.join(root, base)
        for d, _, files in os.walk(top):
            for f in files:
                if not f.endswith((".hpp", ".cpp", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(d, f), top)
                folder = rel.split(os.sep)[0]
                if folder not in may:
                    if os.sep in rel:
                        problems.append(f"{base}/{rel}: folder '{folder}' is not a layer of docs/architecture.md")
                    continue
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = layer_of_include(top, os.path.dirname(rel), rel, m.group(1))
                        if target is None or target == folder:
                            continue
                        seen += 1
                        if target not in may:
                            problems.append(f"{base}/{rel}:{n}: includes '{m.group(1)}' of unknown folder '{target}'")
                        elif target not in may[folder]:
                            problems.append(f"{base}/{rel}:{n}: layer '{folder}' includes '{m.group(1)}' of layer "
                                            f"'{target}', which docs/architecture.md does not let it include "
                                            f"(it may include {', '.join(sorted(may[folder])) or 'nothing'})")
    headers = sorted(os.path.relpath(os.path.join(d, f), os.path.join(root, "include"))
                     for d, _, fs in os.walk(os.path.join(root, "include", "nereus")) for f in fs if f.endswith(".hpp"))
    with open(os.path.join(root, "tests", "all_headers.cpp"), encoding="utf-8") as fh:
        listed = set(m.group(1) for m in map(INCLUDE.match, fh) if m)
    for h in headers:
        if h not in listed:
            problems.append(f"tests/all_headers.cpp: does not include public header {h}")
    for p in problems:
        print("FAIL", p)
    print(f"layers: {seen} cross-folder includes checked, {len(headers)} public headers, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
