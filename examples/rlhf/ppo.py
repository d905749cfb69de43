#!/usr/bin/python3
"""PPO on Nereus, for real, on CPUs: the actor's and critic's params and Adam state live
in Nereus units, every stage computes on the units' shards with tensor and pipeline
parallelism (tp_llama.py), and plan changes run while the following stages compute.

Task: a verifiable (rule) reward, the share of response tokens that are numbers (token
ids 0-99), each numeric token earning 1/len; responses grow 8 tokens longer each time
the mean reward passes 0.4, up to 40 (a length curriculum). Generation keeps its KV cache
in the units' workspace, allocated from the devices' capacity, so the cache grows
against what the plan leaves free.

Plan changes (--plan-changes): `controller` (default) reports each completed step's
stage times and memory peak to the live controller after the next generation, with the
next step's response length, and begins the transition it admits; `every:K` alternates
two plans; `none` keeps the first plan (at the default capacity it runs out of memory
once responses reach 32 tokens). --force-transition STEP:MODEL_STAGE=SPEC changes a
stage's layout at a step. --no-nereus runs the same math on plain torch tensors with a
fixed plan (the baseline for Nereus's cost; plain_job.py). --check-state compares the
training state bit for bit across every transition (state_check.py); --perfetto writes a
trace of stages and transitions (perfetto.py). When the controller finds no plan that
runs the next step, the run stops with its reason (`ppo.py: error: ...`, exit 1). See
docs/embedding.md.

Usage: PYTHONPATH=BUILD/python examples/rlhf/ppo.py [--steps N] [--seed S] [--json]
    [--check-state] [--perfetto FILE] [--plan-changes controller|none|every:K]
    [--force-transition STEP:MODEL_STAGE=SPEC ...] [--capacity BYTES] [--no-nereus]
    [--grow-at REWARD] [--algorithm ppo|grpo] [--actor-train SPEC] [--async]

--async runs the job asynchronously (ppo_async.py): generation on its own devices samples
the next batch while training computes, and weight updates reach it in flight; plan
changes (--plan-changes none (its default) or controller, --force-transition) run after a
training step, beside generation.
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
from perfetto import Trace  # noqa: E402
from plain_job import PlainJob  # noqa: E402
from state_check import SNAP  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOBS = {"ppo": os.path.join(HERE, "ppo-tiny-rule.json"), "grpo": os.path.join(HERE, "grpo-tiny-rule.json")}
GROUP = 4  # GRPO: samples per prompt (grpo-tiny-rule.json)
# The framework's first plan: generation shares the actor's training devices (as a hybrid
# engine does), so its KV cache grows against what training leaves free.
PLAN = {
    "actor/generate": "tp=1,pp=1,dp=2,devices=4-5",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "actor/train": "tp=2,pp=1,dp=1,devices=4-5",
    "critic/train": "tp=2,pp=1,dp=1,devices=6-7",
}
CAPACITY = "12.6MiB"
# The payback rule's γ: this small, only changes that memory forces are admitted. On CPUs
# a TP group's ranks run one after another, so the cost model's time gains from TP are not
# real here; the memory that the KV cache presses against is.
GAMMA = 1e-4
GROW_AT, MAX_LEN = 0.4, 40
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


def split(n, parts, i):
    return slice(i * n // parts, (i + 1) * n // parts)


class Step:
    """Stage times of one step, the time spent waiting to enter stages, and each stage's
    span on its devices (for --perfetto)."""

    def __init__(self):
        self.seconds, self.waited, self.spans = {}, 0.0, []

    def stage(self, job, name):
        step = self

        class Held:
            def __enter__(self):
                t0 = time.perf_counter()
                self.ctx = job.stage(name)
                self.units = self.ctx.__enter__()
                self.t1 = time.perf_counter()
                step.waited += self.t1 - t0
                return self.units

            def __exit__(self, *exc):
                t2 = time.perf_counter()
                step.seconds[name] = t2 - self.t1
                devices = sorted({d for u in self.units for d in u.devices})
                step.spans.append((name, self.t1, t2, devices))
                return self.ctx.__exit__(*exc)

        return Held()


def generate(job, st, prompts, length, gen):
    """Sampling with a KV cache in each unit's workspace: sized for the whole response up
    front and allocated from the devices' capacity while the stage runs."""
    out = []
    total = prompts.shape[1] + length
    units = job.units("actor/generate")
    rows = [split(len(prompts), len(units), i) for i in range(len(units))]
    job.set_workspace("actor/generate", max(tp_llama.KVCache.nbytes(tp_llama.UnitModel(ACTOR, u), r.stop - r.start, total)
                                            for u, r in zip(units, rows)))
    with st.stage(job, "actor/generate") as units:
        with torch.no_grad():
            for i, u in enumerate(units):
                m = tp_llama.UnitModel(ACTOR, u)
                part = prompts[rows[i]]
                cache = tp_llama.KVCache(m, len(part), total, lambda d, n, u=u: u.workspace(d).data[:n])
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


def grpo_loss(plen, old_lp, ref_lp, adv, clip, beta):
    """GRPO: the clipped surrogate with group-relative advantages, and the KL to the
    reference as a loss term (the k3 estimator), per token."""
    def loss(m, part, rows):
        lp = m.token_log_probs(m.hidden(part[:, :-1])[:, plen - 1:], part[:, plen:])
        ratio = (lp - old_lp[rows]).exp()
        a = adv[rows]
        surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
        d = ref_lp[rows] - lp
        return -(surrogate - beta * (d.exp() - d - 1)).sum() / adv.numel()

    return loss


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


def summary(steps, transitions, checks):
    n = max(1, len(steps) // 10)
    first = sum(s["reward_mean"] for s in steps[:n]) / n
    last = sum(s["reward_mean"] for s in steps[-n:]) / n
    print(f"reward first 10%: {first:.3f}, last 10%: {last:.3f}; transitions {len(transitions)}; "
          f"state checks {checks['passed']} passed, {checks['failed']} failed", file=sys.stderr)


def run_async(a, gen, force, controller):
    """--async: the job file with "mode": "async", generation on its own devices (ppo_async.py)."""
    import tempfile
    import ppo_async
    with open(JOBS[a.algorithm]) as f:
        spec = dict(json.load(f), mode="async", max_staleness=1)
    plan = {k: v for k, v in ppo_async.PLAN.items() if not (a.algorithm == "grpo" and k.startswith("critic/"))}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{a.algorithm}-tiny-rule-async.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        job = nereus.Job(path, plan, devices=8, capacity=a.capacity, seed=a.seed, gamma=GAMMA)
    init_weights(job, a.seed)
    trace = Trace(time.perf_counter()) if a.perfetto else None
    out = ppo_async.run(job, a, gen, trace, force=force, controller=controller)
    if trace:
        trace.write(a.perfetto)
    if a.json:
        print(json.dumps(out))
    summary(out["steps"], out["transitions"], out["state_checks"])
    u = out["weight_updates"]
    if u:
        print(f"weight updates {len(u)}: median {sorted(x['seconds'] for x in u)[len(u) // 2]:.3f}s, paused median "
              f"{sorted(x['paused_seconds'] for x in u)[len(u) // 2] * 1e3:.2f} ms; wall {out['wall_seconds']:.1f}s",
              file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--check-state", action="store_true", help="compare every stage's state bit for bit across transitions")
    ap.add_argument("--force-transition", action="append", default=[], metavar="STEP:MODEL_STAGE=SPEC")
    ap.add_argument("--plan-changes", help="controller (default), none, or every:K (alternate two plans); "
                                           "--async: none (default) or controller")
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="one-step off-policy: generation runs on its own devices while training computes, and "
                         "weight updates reach it in flight (ppo_async.py)")
    ap.add_argument("--capacity", default=CAPACITY, help=f"bytes per device (default {CAPACITY})")
    ap.add_argument("--perfetto", metavar="FILE", help="write a Perfetto/Chrome trace of stages and transitions")
    ap.add_argument("--algorithm", choices=sorted(JOBS), default="ppo",
                    help="ppo (actor, critic, reference) or grpo (group-relative advantages, no critic)")
    ap.add_argument("--no-nereus", action="store_true", help="the same math on plain torch tensors, fixed plan")
    ap.add_argument("--actor-train", metavar="SPEC",
                    help=f"the actor's training layout (default {PLAN['actor/train']}), e.g. "
                         "tp=1,pp=1,fsdp=2,dp=1,devices=4-5 to train it FSDP-sharded")
    ap.add_argument("--grow-at", type=float, default=GROW_AT, metavar="REWARD",
                    help=f"responses grow 8 tokens once the mean reward passes this (default {GROW_AT}; "
                         "below 0: every step, so memory runs short within a few steps)")
    a = ap.parse_args()
    if a.plan_changes is None:
        a.plan_changes = "none" if a.asynchronous else "controller"
    if a.asynchronous and (a.plan_changes.startswith("every:") or a.no_nereus or a.actor_train):
        raise SystemExit("ppo.py: error: --async changes plan only through the controller or --force-transition, on "
                         "Nereus with its own layouts: drop --plan-changes every:K, --no-nereus and --actor-train")
    force = parse_force(a.force_transition)
    every = int(a.plan_changes.split(":")[1]) if a.plan_changes.startswith("every:") else 0
    controller = a.plan_changes == "controller"
    if not every and not controller and a.plan_changes != "none":
        raise SystemExit(f"ppo.py: error: --plan-changes {a.plan_changes}: takes controller, none or every:K")
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    grpo = a.algorithm == "grpo"
    plan, alternate = ({k: v for k, v in p.items() if not (grpo and k.startswith("critic/"))} for p in (PLAN, ALTERNATE))
    if a.actor_train:
        plan["actor/train"] = a.actor_train
    if a.asynchronous:
        return run_async(a, gen, force, controller)
    job = nereus.Job(JOBS[a.algorithm], plan, devices=8, capacity=a.capacity, seed=a.seed, gamma=GAMMA)
    if a.no_nereus:
        if force or every:
            raise SystemExit("ppo.py: error: --no-nereus runs a fixed plan (no transitions)")
        job, controller = PlainJob(job), False
    init_weights(job, a.seed)
    batch, plen = 16, 8
    length, beta, clip, lr = 8, 0.02, 0.2, 3e-3
    steps, transitions, decisions, checks = [], [], [], {"passed": 0, "failed": 0}
    pending, prev = None, None  # a transition in flight; the last complete step's measurements
    origin = time.perf_counter()
    trace = Trace(origin) if a.perfetto else None
    for k in range(a.steps):
        st = Step()
        t0 = time.perf_counter()
        ran_on = job.plan
        prompts = torch.randint(100, ACTOR["vocab_size"], (batch // GROUP if grpo else batch, plen), generator=gen)
        if grpo:
            prompts = prompts.repeat_interleave(GROUP, 0)
        seqs = generate(job, st, prompts, length, gen)
        resp = seqs[:, plen:]
        numeric = (resp < 100).float()
        score = numeric.mean(1)
        # The curriculum: responses grow once the policy writes enough numbers.
        next_length = length + 8 if score.mean().item() > a.grow_at and length < MAX_LEN else length
        target, decision = None, None
        if k in force:
            target, trigger = dict(job.plan, **force[k]), "forced"
        elif every and k % every == every - 1:
            target, trigger = alternate if job.plan["actor/train"] == plan["actor/train"] else plan, a.plan_changes
        elif controller and prev:
            # The last complete step's stage times and memory peak, and the next step's
            # response length: the controller answers whether the plan should change.
            decision = job.report_step(prev["stage_seconds"], prev["length"], prev["length"], peak_bytes=prev["peak"],
                                       next_response_len_mean=next_length, next_response_len_p95=next_length)
            if decision["replanned"]:
                decisions.append({key: decision[key] for key in ("step", "trigger", "admitted", "why", "current_seconds",
                                                                 "target_seconds", "transition_seconds", "horizon_steps",
                                                                 "moved_bytes", "decision_ms")} | {"at_step": k})
            if decision["admitted"]:
                target, trigger = decision["target"], decision["trigger"]
        if target is not None and target != job.plan:
            began = time.perf_counter()
            handle = job.begin_transition(target)  # runs while the rest of the step computes
            pending = {"step": k, "trigger": trigger, "handle": handle, "began": began, "waited": st.waited,
                       "decision": decision}
            SNAP.armed, SNAP.before = a.check_state, {}
        old_lp = infer_log_probs(job, st, "actor/infer", seqs, plen, ACTOR)
        ref_lp = infer_log_probs(job, st, "reference/infer", seqs, plen, ACTOR)
        kl = old_lp - ref_lp
        if grpo:
            # Each sequence's score against its group's (the same prompt's samples).
            g = score.view(-1, GROUP)
            adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
            adv_w = adv[:, None].expand_as(old_lp)
            pl = train(job, st, "actor/train", ACTOR, seqs, grpo_loss(plen, old_lp, ref_lp, adv_w, clip, beta), lr, epochs=2)
            vl = 0.0
        else:
            values = infer_values(job, st, seqs, plen)
            # Dense rule reward: each numeric token earns 1/len (the step's score sums them).
            rewards = -beta * kl + numeric / resp.shape[1]
            adv, returns = gae(rewards, values)
            adv_w = (adv - adv.mean()) / (adv.std() + 1e-8)
            pl = train(job, st, "actor/train", ACTOR, seqs, policy_loss(plen, old_lp, adv_w, clip), lr, epochs=2)
            vl = train(job, st, "critic/train", CRITIC, seqs, value_loss(plen, values, returns, clip), lr, epochs=2)
        peak = max([d["step_peak"] for d in job.devices()], default=0)
        job.end_step()
        if pending:
            w0 = time.perf_counter()
            report = pending["handle"].wait()
            exposed = st.waited - pending["waited"] + time.perf_counter() - w0
            if SNAP.armed:
                # Training stages: every slot; generation and inference stages of trained
                # models were synced or rebuilt from them; the reference is checked as is.
                bad = SNAP.compare(job)
                checks["passed" if not bad else "failed"] += 1
                if bad:
                    print("check-state:", bad, file=sys.stderr)
            d = pending["decision"] or {}
            transitions.append({"step": pending["step"], "trigger": pending["trigger"], "completed": report["completed"],
                                "error": report["error"], "current_seconds": d.get("current_seconds"),
                                "target_seconds": d.get("target_seconds"),
                                "transition_seconds": d.get("transition_seconds"), "horizon_steps": d.get("horizon_steps"),
                                "moved_bytes": report["moved_bytes"], "copied_bytes": report["copied_bytes"],
                                "seconds": report["seconds"],
                                "exposed_seconds": exposed, "plan": job.plan})
            if trace:
                trace.transition(pending["began"], report)
            pending = None
        t1 = time.perf_counter()
        if trace:
            trace.step(k, st, t0, t1)
        steps.append({"step": k, "reward_mean": score.mean().item(), "policy_loss": pl, "value_loss": vl,
                      "kl": kl.mean().item(), "response_len": length, "seconds": t1 - t0, "peak_bytes": peak,
                      "stage_seconds": st.seconds, "plan": ran_on})
        if not a.json:
            print(f"step {k:3d} reward {score.mean().item():.3f} len {length:2d} kl {kl.mean().item():+.4f} "
                  f"pl {pl:+.4f} vl {vl:.4f} peak {peak / 2**20:.2f} MiB {t1 - t0:.2f}s"
                  + (f"  transition ({transitions[-1]['trigger']}) {transitions[-1]['seconds']:.2f}s, "
                     f"exposed {transitions[-1]['exposed_seconds']:.3f}s"
                     if transitions and transitions[-1]["step"] == k else ""), flush=True)
        prev = {"stage_seconds": st.seconds, "length": length, "peak": peak}
        length = next_length
    if trace:
        trace.write(a.perfetto)
    out = {"steps": steps, "transitions": transitions, "decisions": decisions, "state_checks": checks}
    if a.json:
        print(json.dumps(out))
    summary(steps, transitions, checks)
    return 1 if checks["failed"] or any(not t["completed"] for t in transitions) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except nereus.Error as e:  # e.g. the controller found no plan that runs the next step
        print(f"ppo.py: error: {e}", file=sys.stderr)
        sys.exit(1)
