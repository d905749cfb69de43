"""ppo.py --perfetto: the run as a Chrome/Perfetto trace (ui.perfetto.dev)."""
import json


class Trace:
    """--perfetto: a Chrome/Perfetto trace (ui.perfetto.dev) with, per device, a track of
    the stages computing on it and tracks of the transition's builds and frees of its
    units (one track per overlapping build), so a transition is seen hiding behind steps."""

    def __init__(self, origin):
        self.origin, self.events, self.lanes, self.names, self.transitions = origin, [], {}, {}, 0

    def _us(self, t):
        return round((t - self.origin) * 1e6, 1)

    def _track(self, tid, name):
        self.names[tid] = name
        return tid

    def step(self, k, st, t0, t1):
        self.events.append({"name": f"step {k}", "ph": "X", "pid": 0, "tid": self._track(0, "steps"),
                            "ts": self._us(t0), "dur": self._us(t1) - self._us(t0), "args": {"step": k}})
        for name, a, b, devices in st.spans:
            for d in devices:
                self.events.append({"name": name, "ph": "X", "pid": 0, "tid": self._track(1000 * (d + 1), f"device {d}: stages"),
                                    "ts": self._us(a), "dur": self._us(b) - self._us(a), "args": {"step": k}})

    def spans(self, name, st, t0, t1):
        """A stream's run other than the training step (async generation) and its stages."""
        self.events.append({"name": name, "ph": "X", "pid": 0, "tid": self._track(1, "generation"),
                            "ts": self._us(t0), "dur": self._us(t1) - self._us(t0)})
        for stage, a, b, devices in st.spans:
            for d in devices:
                self.events.append({"name": stage, "ph": "X", "pid": 0, "tid": self._track(1000 * (d + 1), f"device {d}: stages"),
                                    "ts": self._us(a), "dur": self._us(b) - self._us(a)})

    def update(self, r):
        """An async weight update: its copy, and the pause at its switch (report times are
        on CLOCK_MONOTONIC, as time.perf_counter is on Linux)."""
        a, b = r["started"], r["started"] + r["seconds"]
        self.events.append({"name": f"weight update v{r['weight_version']}", "ph": "X", "pid": 0,
                            "tid": self._track(2, "weight updates"), "ts": self._us(a), "dur": self._us(b) - self._us(a),
                            "args": {k: r[k] for k in ("moved_bytes", "copy_seconds", "paused_seconds", "pause", "automatic")}})
        self.events.append({"name": "paused", "ph": "X", "pid": 0, "tid": self._track(3, "generation paused"),
                            "ts": self._us(b - r["paused_seconds"]), "dur": round(r["paused_seconds"] * 1e6, 1)})

    def transition(self, began, report):
        for i, n in enumerate(report["nodes"]):
            a, b = began + n["start"], began + max(n["start"], n["end"])
            for d in n["devices"]:
                lanes = self.lanes.setdefault(d, [])
                lane = next((i for i, end in enumerate(lanes) if end <= a), len(lanes))
                if lane == len(lanes):
                    lanes.append(b)
                lanes[lane] = b
                tid = self._track(1000 * (d + 1) + 1 + lane, f"device {d}: transition" + (f" ({lane + 1})" if lane else ""))
                self.events.append({"name": f"{n['kind']} {n['unit']}", "ph": "X", "pid": 0, "tid": tid,
                                    "ts": self._us(a), "dur": self._us(b) - self._us(a),
                                    "args": {"bytes": n["bytes"], "node": f"{self.transitions}.{i}", "devices": n["devices"]}})
        self.transitions += 1

    def write(self, path):
        meta = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "ppo.py"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}} for t, n in self.names.items()]
        meta += [{"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": t, "args": {"sort_index": t}} for t in self.names]
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms"}, f)
