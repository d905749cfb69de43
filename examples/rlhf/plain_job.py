"""--no-nereus for ppo.py: the same stages and math on plain torch tensors with a fixed
plan, the baseline for what Nereus costs. The shards' boxes come from a Nereus job's units
once, at the start; nothing else does."""
import torch

from state_check import overlap


class PlainShard:
    def __init__(self, s):
        self.device, self.tensor, self.slot, self.dtype, self.box = s.device, s.tensor, s.slot, s.dtype, s.box
        self.data = torch.zeros([hi - lo for lo, hi in s.box], dtype=s.data.dtype)


class PlainUnit:
    def __init__(self, u, job):
        self.layout, self.devices, self.replica = u.layout, u.devices, u.replica
        self._shards = [PlainShard(s) for s in u.shards(slot=None)]
        self._job = job

    def shards(self, slot="param"):
        return [s for s in self._shards if slot is None or s.slot == slot]

    def workspace(self, device):
        class Workspace:
            data = torch.empty(self._job.workspace, dtype=torch.uint8)
        return Workspace()


class PlainJob:
    """--no-nereus: the same stages and math on plain torch tensors with a fixed plan. The
    shards' boxes come from a Nereus job's units once, at the start; nothing else does."""

    def __init__(self, job):
        self.model_stages = job.model_stages
        self.plan = job.plan
        self._units = {st: [PlainUnit(u, self) for u in job.units(st)] for st in self.model_stages}
        self._updates = {st: 0 for st in self.model_stages}
        self.workspace = 0

    def set_workspace(self, stage, nbytes):
        self.workspace = nbytes

    def units(self, stage):
        return self._units[stage]

    def state(self, stage):
        return {"update_count": self._updates[stage]}

    def stage(self, name):
        job = self

        class Held:
            def __enter__(self):
                return job._units[name]

            def __exit__(self, exc, *_):
                if exc is None and name.endswith("/train"):
                    job._updates[name] += 1
                return False

        return Held()

    def end_step(self):
        """Weight sync: each trained model's params into its other stages, box by box."""
        for train in [s for s in self.model_stages if s.endswith("/train")]:
            role = train.split("/")[0]
            src = {}
            for s in self._units[train][0].shards():
                src.setdefault(s.tensor, []).append(s)
            for stage in self.model_stages:
                if stage == train or not stage.startswith(role + "/"):
                    continue
                for u in self._units[stage]:
                    for d in u.shards():
                        for s in src[d.tensor]:
                            where = overlap(d.box, s.box)
                            if where:
                                d.data[where[0]] = s.data[where[1]]

    def devices(self):
        return []

    def begin_transition(self, plan):
        raise SystemExit("ppo.py: error: --no-nereus runs a fixed plan (no transitions)")
