"""Counting checks for the Python test scripts: check() records, finish() prints the
closing 'N passed, N failed' line and exits non-zero on any failure."""
import sys

_failures = []
_passed = 0


def check(cond, what):
    global _passed
    if cond:
        _passed += 1
    else:
        _failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def finish(name):
    print(f"{name}: {_passed} passed, {len(_failures)} failed")
    sys.exit(1 if _failures else 0)
