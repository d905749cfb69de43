"""ppo.py --check-state: each checked model-stage's state taken while the stage still
holds its units, compared bit for bit, box by box, with the state after a transition."""
import torch


def overlap(box, other):
    """Where two boxes meet: (slices into box's block, slices into other's block), or None."""
    inter = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, other)]
    if not all(lo < hi for lo, hi in inter):
        return None
    return (tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, box)),
            tuple(slice(lo - c, hi - c) for (lo, hi), (c, _) in zip(inter, other)))


def state_of(stage, units, out=None):
    """A model-stage's slots by their boxes: {(stage, tensor, slot): {box: copy}}."""
    out = {} if out is None else out
    for u in units:
        for s in u.shards(slot=None):
            out.setdefault((stage, s.tensor, s.slot), {})[tuple(s.box)] = s.data.clone()
    return out


class Snapshots:
    """--check-state: each checked stage's state taken while the stage still holds its
    units (a transition may free old units as soon as their stage is done this step)."""

    STAGES = ("actor/train", "critic/train", "reference/infer")

    def stages(self, job):
        return [s for s in self.STAGES if s in job.model_stages]

    def __init__(self):
        self.armed, self.before = False, {}

    def take(self, stage, units):
        if self.armed and stage in self.STAGES:
            state_of(stage, units, self.before)

    def compare(self, job):
        """Once the transition is done: "" when every state taken reads back bit for bit
        from the units now, else what differs first."""
        self.armed = False
        after = {}
        for stage in self.stages(job):
            state_of(stage, job.units(stage), after)
        return same_state(self.before, after, set(self.stages(job)))


SNAP = Snapshots()


def same_state(before, after, stages):
    """Each (stage, tensor, slot)'s boxes before, read back from the boxes after (bit for bit)."""
    for (stage, tensor, slot), boxes in before.items():
        if stage not in stages:
            continue
        later = after[(stage, tensor, slot)]
        for box, data in boxes.items():
            for box2, data2 in later.items():
                where = overlap(box, box2)
                if where:
                    x, y = data[where[0]], data2[where[1]]
                    if not torch.equal(x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32),
                                       y.view(torch.int16) if y.element_size() == 2 else y.view(torch.int32)):
                        return f"{stage} {tensor}@{slot} box {box} differs"
    return ""
