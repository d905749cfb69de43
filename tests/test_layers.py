#!/usr/bin/env python3
"""The layer rule of docs/architecture.md: a folder of include/nereus/ or src/ includes
only folders of a lower layer (or itself), so no include cycle can form between folders.
Also checks that tests/all_headers.cpp includes every public header, so one translation
unit compiles them all together (one name per concept across the public API)."""
import os
import re
import sys

LAYERS = ["base", "core", "plan", "control", "transport", "runtime", "cluster", "sim", "bench", "cli", "daemon", "python"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# Front ends may use each other only in this direction (the CLI runs the benches).
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_of_include(src_root, folder, path, inc):
    if inc.startswith("nereus/"):
        return inc.split("/")[1]
    if inc.startswith("../"):
        return os.path.normpath(os.path.join(folder, inc)).split(os.sep)[0]
    return None


def main(root):
    problems = []
    seen = 0
    for base in ("include/nereus", "src"):
        top = os.path.join(root, base)
        for d, _, files in os.walk(top):
            for f in files:
                if not f.endswith((".hpp", ".cpp", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(d, f), top)
                folder = rel.split(os.sep)[0]
                if folder not in RANK:
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
                        if target not in RANK:
                            problems.append(f"{base}/{rel}:{n}: includes '{m.group(1)}' of unknown folder '{target}'")
                        elif RANK[target] >= RANK[folder]:
                            problems.append(f"{base}/{rel}:{n}: layer '{folder}' includes '{m.group(1)}' of layer "
                                            f"'{target}', which is not below it")
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
