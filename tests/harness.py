"""Counting checks for the Python test scripts: check() records, finish() prints the
closing 'N passed, N failed' line and exits non-zero on any failure."""
import json
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
