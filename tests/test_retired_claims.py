#!/usr/bin/python3
"""Claims the docs once made that are no longer true, so they do not come back; and no file
of the repository reads the design folder beside a developer's clone (`../shared`): a
clone alone must build, test and run its examples.

Usage: test_retired_claims.py SOURCE_ROOT. Add a claim here when a change retires it."""
import glob
import os
import re
import sys

# (pattern, what is true instead)
RETIRED = [
    (r"Member`?\)? works on host\s+devices only", "nereus.Member runs on GPU daemons too (memory='cuda')"),
    (r"--devices cuda:N`? refuse", "GPU daemons take a framework member"),
    (r"why gets stay the default", "two-sided builds are the default since 2026-12-06"),
    (r"Transitions overlapping the steps are not\s+there yet", "cluster job --overlap runs them beside the next step"),
    (r"a C\+\+ program that plans, runs", "examples/embed holds two C++ programs"),
    (r"a drift trace growing to 1,024", "examples/traces holds five traces"),
    (r"only its stages exist", "ReMax's stages run in the job runtime and the simulator"),
    (r"Member`? run lockstep jobs only", "async jobs run across daemons with nereus.Member frameworks (2026-12-08)"),
    (r"run on their graph with the truth's link\s+efficiencies", "the truth times transitions with its own model (2026-12-08)"),
]
# Files that may name the design folder: the optional presets check and its environment.
MAY_NAME_SHARED = {"tests/test_core.cpp", "tests/meson.build", "tests/test_retired_claims.py"}


def files(root):
    pats = ["README.md", "docs/*.md", "examples/**/*.py", "examples/**/*.cpp", "scripts/*", "benches/**/*.py",
            "benches/**/*.sh", "tests/*.py", "tests/*.cpp", "tests/*.hpp", "tests/meson.build", "src/**/*.cpp",
            "src/**/*.hpp", "include/**/*.hpp"]
    seen = set()
    for p in pats:
        for f in glob.glob(os.path.join(root, p), recursive=True):
            if os.path.isfile(f) and f not in seen:
                seen.add(f)
                yield f


def main(root):
    failed = 0
    docs = [f for f in files(root) if f.endswith(".md")]
    if not docs:
        print(f"FAIL no docs under {root}")
        return 1
    for f in docs:
        text = open(f, encoding="utf-8").read()
        for pattern, truth in RETIRED:
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                print(f"FAIL {os.path.relpath(f, root)}:{line}: retired claim '{m.group(0)}' ({truth})")
                failed += 1
    for f in files(root):
        rel = os.path.relpath(f, root)
        if rel in MAY_NAME_SHARED:
            continue
        text = open(f, encoding="utf-8", errors="replace").read()
        for m in re.finditer(r"\.\./shared\b|NEREUS_SHARED", text):
            line = text.count("\n", 0, m.start()) + 1
            print(f"FAIL {rel}:{line}: reads the design folder beside the clone ('{m.group(0)}'); copy what it needs")
            failed += 1
    print(f"{len(docs)} docs checked for {len(RETIRED)} retired claims; {failed} found")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
