#!/usr/bin/python3
"""PPO on Nereus, for real, on CPUs: the actor's and critic's params and Adam state live
in Nereus units, every stage computes on the units' shards with tensor and pipeline
parallelism (tp_llama.py), and plan changes run while the following stages compute.

Task: a verifiable (rule) reward, the share of response tokens that are digits (token
ids 0-9); responses grow 8 tokens longer each time the mean reward passes 0.5 (a length
curriculum, so the KV cache grows as the policy improves).

Usage: PYTHONPATH=BUILD/python examples/rlhf/ppo.py [--steps N] [--seed S] [--json]
    [--check-state] [--force-transition STEP:MODEL_STAGE=SPEC ...] [--plan-changes none|every:K]

Work in progress (issue 13): the live controller and --perfetto are not here yet;
transitions are the forced ones and every:K. --no-nereus runs the same math on plain
torch tensors with a fixed plan (the baseline for Nereus's cost).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nereus  # noqa: E402
import tp_llama  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "ppo-tiny-rule.json")
PLAN = {
    "actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=4-5",
    "actor/train": "tp=2,pp=1,dp=1,devices=4-5",
    "critic/train": "tp=2,pp=1,dp=1,devices=6-7",
}
ALTERNATE = dict(PLAN, **{"actor/train": "tp=1,pp=2,dp=1,devices=4-5", "critic/train": "tp=1,pp=1,dp=2,devices=6-7"})


def config(name):
    with open(os.path.join(ROOT, "presets", "models", name + ".json")) as f:
        return json.load(f)


ACTOR, CRITIC = config("tiny-llama"), config("tiny-llama-value")


def init_weights(job, seed):
    """Small random weights for the actor (and reference) and the critic: written once
    into the training units' master and param slots and the other stages' params."""
    g = torch.Generator().manual_seed(seed)
    full, shapes = {}, {}  # whole shapes from every unit's boxes
    for stage in job.model_stages:
        role = stage.split("/")[0]
        for u in job.units(stage):
            for s in u.shards(slot="param"):
                k = ("actor" if role == "reference" else role, s.tensor)
                shapes[k] = [max(a, hi) for a, (_, hi) in zip(shapes.get(k, [0] * len(s.box)), s.box)]
    for k, shape in sorted(shapes.items()):
        norm = k[1].endswith("norm.weight")
        full[k] = torch.ones(shape) if norm else 0.02 * torch.randn(shape, generator=g)
    for stage in job.model_stages:
        role = stage.split("/")[0]
        src = "actor" if role == "reference" else role
        for u in job.units(stage):
            for s in u.shards(slot=None):
                idx = tuple(slice(lo, hi) for lo, hi in s.box)
                if s.slot in ("param", "master"):
                    s.data.copy_(full[(src, s.tensor)][idx])
                else:
                    s.data.zero_()


class PlainShard:
    def __init__(self, s):
        self.device, self.tensor, self.slot, self.dtype, self.box = s.device, s.tensor, s.slot, s.dtype, s.box
        self.data = torch.zeros([hi - lo for lo, hi in s.box], dtype=s.data.dtype)


class PlainUnit:
    def __init__(self, u):
        self.layout, self.devices, self.replica = u.layout, u.devices, u.replica
        self._shards = [PlainShard(s) for s in u.shards(slot=None)]

    def shards(self, slot="param"):
        return [s for s in self._shards if slot is None or s.slot == slot]


class PlainJob:
    """--no-nereus: the same stages and math on plain torch tensors with a fixed plan. The
    shards' boxes come from a Nereus job's units once, at the start; nothing else does."""

    def __init__(self, job):
        self.model_stages = job.model_stages
        self.plan = job.plan
        self._units = {st: [PlainUnit(u) for u in job.units(st)] for st in self.model_stages}
        self._updates = {st: 0 for st in self.model_stages}

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

    def begin_transition(self, plan):
        raise SystemExit("ppo.py: error: --no-nereus runs a fixed plan (no transitions)")


def split(n, parts, i):
    return slice(i * n // parts, (i + 1) * n // parts)


class Step:
    """Stage times of one step, and the time spent waiting to enter stages."""

    def __init__(self):
        self.seconds, self.waited = {}, 0.0

    def stage(self, job, name):
        step = self

        class Held:
            def __enter__(self):
                t0 = time.perf_counter()
                self.ctx = job.stage(name)
                units = self.ctx.__enter__()
                self.t1 = time.perf_counter()
                step.waited += self.t1 - t0
                return units

            def __exit__(self, *exc):
                step.seconds[name] = time.perf_counter() - self.t1
                return self.ctx.__exit__(*exc)

        return Held()


def generate(job, st, prompts, length, gen):
    out = []
    with st.stage(job, "actor/generate") as units:
        with torch.no_grad():
            for i, u in enumerate(units):
                m = tp_llama.UnitModel(ACTOR, u)
                part = prompts[split(len(prompts), len(units), i)]
                cache = {}
                h = m.hidden(part, 0, cache)
                seq = part
                for t in range(length):
                    tok = m.sample(h[:, -1], gen)
                    seq = torch.cat([seq, tok[:, None]], 1)
                    if t + 1 < length:
                        h = m.hidden(tok[:, None], seq.shape[1] - 1, cache)
                out.append(seq)
    return torch.cat(out)


def infer_log_probs(job, st, stage, seqs, plen, cfg):
    out = []
    with st.stage(job, stage) as units, torch.no_grad():
        for i, u in enumerate(units):
            m = tp_llama.UnitModel(cfg, u)
            part = seqs[split(len(seqs), len(units), i)]
            h = m.hidden(part[:, :-1])
            out.append(m.token_log_probs(h[:, plen - 1:], part[:, plen:]))
        SNAP.take(stage, units)
    return torch.cat(out)


def infer_values(job, st, seqs, plen):
    out = []
    with st.stage(job, "critic/infer") as units, torch.no_grad():
        for i, u in enumerate(units):
            m = tp_llama.UnitModel(CRITIC, u)
            part = seqs[split(len(seqs), len(units), i)]
            out.append(m.values(m.hidden(part[:, :-1]))[:, plen - 1:, 0])
    return torch.cat(out)


def adam(job, stage, models, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """Gradient sync, then Adam on every master shard in place, and param = bf16(master).

    Shards with the same (tensor, box) are copies of one parameter — replicated tensors
    on TP ranks, kv heads replicated when tp > kv heads, DP replicas — so each gets the sum
    of their gradients (the all-reduce), and every copy takes the same update."""
    groups = {}
    for m in models:
        for shard, leaf in m.leaves():
            groups.setdefault((shard.tensor, tuple(shard.box)), []).append((shard, leaf))
    t = job.state(stage)["update_count"] + 1
    params = {}
    for u in job.units(stage):
        for s in u.shards(slot=None):
            params[(s.device, s.tensor, s.slot, tuple(s.box))] = s
    with torch.no_grad():
        for (name, box), copies in groups.items():
            grads = [leaf.grad for _, leaf in copies if leaf.grad is not None]
            if not grads:
                continue
            g = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
            for shard, leaf in copies:
                m1 = params[(shard.device, name, "exp_avg", box)].data
                m2 = params[(shard.device, name, "exp_avg_sq", box)].data
                m1.mul_(beta1).add_(g, alpha=1 - beta1)
                m2.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                step = lr * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)
                leaf.addcdiv_(m1, m2.sqrt().add_(eps), value=-step)
                params[(shard.device, name, "param", box)].data.copy_(leaf)


def train(job, st, stage, cfg, seqs, loss_of, lr, epochs):
    """Epochs of one training stage: each DP unit takes its rows of the batch, its loss
    (normalised by the whole batch) is back-propagated into its master slot, then Adam."""
    losses = []
    with st.stage(job, stage) as units:
        for _ in range(epochs):
            models = [tp_llama.UnitModel(cfg, u, train=True) for u in units]
            total = 0.0
            for i, m in enumerate(models):
                rows = split(len(seqs), len(models), i)
                loss = loss_of(m, seqs[rows], rows)
                loss.backward()
                total += loss.item()
            adam(job, stage, models, lr)
            losses.append(total)
        SNAP.take(stage, units)
    return sum(losses) / len(losses)


def policy_loss(plen, old_lp, adv, clip):
    def loss(m, part, rows):
        lp = m.token_log_probs(m.hidden(part[:, :-1])[:, plen - 1:], part[:, plen:])
        ratio = (lp - old_lp[rows]).exp()
        a = adv[rows]
        return -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).sum() / adv.numel()

    return loss


def value_loss(plen, old_v, returns, clip):
    def loss(m, part, rows):
        v = m.values(m.hidden(part[:, :-1]))[:, plen - 1:, 0]
        vc = old_v[rows] + (v - old_v[rows]).clamp(-clip, clip)
        r = returns[rows]
        return 0.5 * torch.max((v - r) ** 2, (vc - r) ** 2).sum() / returns.numel()

    return loss


def overlap(box, other):
    """Where two boxes meet: (slices into box's block, slices into other's block), or None."""
    inter = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, other)]
    if not all(lo < hi for lo, hi in inter):
        return None
    return (tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, box)),
            tuple(slice(lo - c, hi - c) for (lo, hi), (c, _) in zip(inter, other)))


def gae(rewards, values, gamma=1.0, lam=0.95):
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    n = rewards.shape[1]
    for t in reversed(range(n)):
        nxt = values[:, t + 1] if t + 1 < n else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


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

    def __init__(self):
        self.armed, self.before = False, {}

    def take(self, stage, units):
        if self.armed and stage in self.STAGES:
            state_of(stage, units, self.before)


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


def parse_force(items):
    out = {}
    for item in items:
        try:
            step, rest = item.split(":", 1)
            stage, spec = rest.split("=", 1)
            out.setdefault(int(step), {})[stage] = spec
        except ValueError:
            raise SystemExit(f"ppo.py: error: --force-transition '{item}' must be STEP:MODEL_STAGE=SPEC")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check-state", action="store_true")
    ap.add_argument("--force-transition", action="append", default=[])
    ap.add_argument("--plan-changes", default="none", help="none, or every:K (alternate two plans)")
    ap.add_argument("--capacity", default="64MiB")
    ap.add_argument("--no-nereus", action="store_true", help="the same math on plain torch tensors, fixed plan")
    a = ap.parse_args()
    force = parse_force(a.force_transition)
    every = int(a.plan_changes.split(":")[1]) if a.plan_changes.startswith("every:") else 0
    if not every and a.plan_changes != "none":
        raise SystemExit(f"ppo.py: error: --plan-changes {a.plan_changes}: this version takes none or every:K")
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    job = nereus.Job(JOB, PLAN, devices=8, capacity=a.capacity, seed=a.seed)
    if a.no_nereus:
        if force or every:
            raise SystemExit("ppo.py: error: --no-nereus runs a fixed plan (no transitions)")
        job = PlainJob(job)
    init_weights(job, a.seed)
    batch, plen = 16, 8
    length, beta, clip, lr = 8, 0.02, 0.2, 3e-3
    steps, transitions, checks = [], [], {"passed": 0, "failed": 0}
    handle, pending = None, None
    for k in range(a.steps):
        st = Step()
        t0 = time.perf_counter()
        prompts = torch.randint(10, 100, (batch, plen), generator=gen)
        seqs = generate(job, st, prompts, length, gen)
        target = None
        if k in force:
            target = dict(job.plan, **force[k])
        elif every and k % every == every - 1:
            target = ALTERNATE if job.plan["actor/train"] == PLAN["actor/train"] else PLAN
        if target is not None and target != job.plan:
            handle = job.begin_transition(target)  # runs while the rest of the step computes
            pending = {"step": k, "trigger": "forced" if k in force else a.plan_changes, "handle": handle,
                       "began": time.perf_counter()}
            SNAP.armed, SNAP.before = a.check_state, {}
        old_lp = infer_log_probs(job, st, "actor/infer", seqs, plen, ACTOR)
        ref_lp = infer_log_probs(job, st, "reference/infer", seqs, plen, ACTOR)
        values = infer_values(job, st, seqs, plen)
        resp = seqs[:, plen:]
        score = (resp < 10).float().mean(1)
        kl = old_lp - ref_lp
        rewards = -beta * kl
        rewards[:, -1] += score
        adv, returns = gae(rewards, values)
        adv_w = (adv - adv.mean()) / (adv.std() + 1e-8)
        pl = train(job, st, "actor/train", ACTOR, seqs, policy_loss(plen, old_lp, adv_w, clip), lr, epochs=2)
        vl = train(job, st, "critic/train", CRITIC, seqs, value_loss(plen, values, returns, clip), lr, epochs=2)
        job.end_step()
        if pending:
            report = pending["handle"].wait()
            if SNAP.armed:
                SNAP.armed = False
                after = {}
                for stage in Snapshots.STAGES:
                    state_of(stage, job.units(stage), after)
                # Training stages: every slot; generation and inference stages of trained
                # models were synced or rebuilt from them; the reference is checked as is.
                bad = same_state(SNAP.before, after, set(Snapshots.STAGES))
                checks["passed" if not bad else "failed"] += 1
                if bad:
                    print("check-state:", bad, file=sys.stderr)
            pending["report"] = report
        seconds = time.perf_counter() - t0
        if pending:
            r = pending["report"]
            transitions.append({"step": pending["step"], "trigger": pending["trigger"], "completed": r["completed"],
                                "moved_bytes": r["moved_bytes"], "seconds": r["seconds"],
                                "exposed_seconds": None, "plan": job.plan})
            pending = None
        if transitions and transitions[-1]["exposed_seconds"] is None and transitions[-1]["step"] == k - 1:
            transitions[-1]["exposed_seconds"] = st.waited
        steps.append({"step": k, "reward_mean": score.mean().item(), "policy_loss": pl, "value_loss": vl,
                      "kl": kl.mean().item(), "response_len": length, "seconds": seconds,
                      "stage_seconds": st.seconds, "plan": job.plan})
        if not a.json:
            print(f"step {k:3d} reward {score.mean().item():.3f} len {length:2d} kl {kl.mean().item():+.4f} "
                  f"pl {pl:+.4f} vl {vl:.4f} {seconds:.2f}s", flush=True)
        if score.mean().item() > 0.5 and length < 48:
            length += 8
    for t in transitions:
        if t["exposed_seconds"] is None:
            t["exposed_seconds"] = 0.0
    out = {"steps": steps, "transitions": transitions, "state_checks": checks}
    if a.json:
        print(json.dumps(out))
    n = max(1, len(steps) // 10)
    first = sum(s["reward_mean"] for s in steps[:n]) / n
    last = sum(s["reward_mean"] for s in steps[-n:]) / n
    print(f"reward first 10%: {first:.3f}, last 10%: {last:.3f}; transitions {len(transitions)}; "
          f"state checks {checks['passed']} passed, {checks['failed']} failed", file=sys.stderr)
    return 1 if checks["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
