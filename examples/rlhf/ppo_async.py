"""ppo.py --async: one-step off-policy PPO/GRPO on an async Nereus job (job file
`"mode": "async"`). Two streams run at once on separate devices:

- generation (a thread): batch k+1 is sampled while the trainer works on batch k. Between
  two decode steps it switches in a weight update whose staging is complete
  (`finish("keep")`: the KV cache stays, later tokens use the new weights), so the update's
  copy can hide behind decoding — when generation is slower than training; on a 2-core
  host the streams take about as long, and the job switches each update in at the start of
  a generation run instead (docs/embedding.md, "Async PPO and GRPO"). Each token's log-probability under the weights that sampled
  it (the behaviour policy) is kept.
- training (the main thread): takes batch k, scores it with the actor's current weights
  (actor/infer: the proximal policy), the reference and the critic, trains, ends the step,
  and begins the update of the new version into actor/generate.

The job keeps generation within max_staleness (1) versions of the trainer: generation run
k reads version k−1 at least, updating itself when the framework has not.

Plan changes (`--plan-changes controller`, `--force-transition`): after a training step the
trainer asks the live controller (its async model: the pool split between the streams) or
takes the forced plan, switches in the update it staged (finish("wait"): after the
generation run in flight), and changes plan while generation goes on: the run in flight
keeps its old units until it ends, the next one starts on the new units (filled from the
trainer where they are behind: one whole version).

Off-policy correction (decoupled PPO, as AReaL does it): the clipped ratio is taken against
the proximal policy (the trainer's weights before this update), and each token's term is
weighted by the truncated importance ratio π_prox/π_behav ≤ 2 of the behaviour policy that
sampled it. On policy the weight is 1 and the loss is ppo.py's.
"""
import queue
import threading
import time

import torch

import nereus
import ppo as base
import tp_llama

# Generation on its own devices (6-7): async generation and training run at the same time.
PLAN = {
    "actor/generate": "tp=1,pp=1,dp=2,devices=6-7",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "actor/train": "tp=2,pp=1,dp=1,devices=4-5",
    "critic/train": "tp=2,pp=1,dp=1,devices=2-3",
}
IS_CAP = 2.0  # truncation of the behaviour importance weight


def decoupled_policy_loss(plen, prox_lp, behav_lp, adv, clip, ref_lp=None, beta=0.0):
    """The clipped surrogate against the proximal policy, weighted per token by the truncated
    behaviour importance ratio; GRPO adds its k3 KL to the reference."""
    w = (prox_lp - behav_lp).exp().clamp(max=IS_CAP)

    def loss(m, part, rows):
        lp = m.token_log_probs(m.hidden(part[:, :-1])[:, plen - 1:], part[:, plen:])
        ratio = (lp - prox_lp[rows]).exp()
        a = adv[rows]
        surrogate = w[rows] * torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
        if ref_lp is not None:
            d = ref_lp[rows] - lp
            surrogate = surrogate - beta * (d.exp() - d - 1)
        return -surrogate.sum() / adv.numel()

    return loss


def generate(job, st, prompts, length, gen, shared):
    """Sampling with a KV cache in the workspace; between decode steps a staged update is
    switched in with pause="keep". Returns the sequences, each response token's behaviour
    log-prob, and the oldest and newest weight versions that sampled the batch."""
    total = prompts.shape[1] + length
    # The KV cache of the whole batch and model: enough for any layout, since the trainer
    # may change the plan between this sizing and the run (its units are known on entry).
    c = base.ACTOR
    hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    job.set_workspace("actor/generate",
                      2 * 4 * len(prompts) * c["num_key_value_heads"] * total * hd * c["num_hidden_layers"])
    with st.stage(job, "actor/generate") as held, torch.no_grad():
        rows = [base.split(len(prompts), len(held), i) for i in range(len(held))]
        models = [tp_llama.UnitModel(base.ACTOR, u) for u in held]
        versions = {u.version for u in held}
        caches = [tp_llama.KVCache(models[i], rows[i].stop - rows[i].start, total,
                                   lambda d, n, u=u: u.workspace(d).data[:n]) for i, u in enumerate(held)]
        seqs = [prompts[r] for r in rows]
        hs = [models[i].hidden(seqs[i], 0, caches[i]) for i in range(len(held))]
        lps = [[] for _ in held]
        for t in range(length):
            for i, m in enumerate(models):
                tok = m.sample(hs[i][:, -1], gen)
                lps[i].append(m.token_log_probs(hs[i][:, -1], tok))
                seqs[i] = torch.cat([seqs[i], tok[:, None]], 1)
                if t + 1 < length:
                    hs[i] = m.hidden(tok[:, None], seqs[i].shape[1] - 1, caches[i])
            with shared["lock"]:  # the trainer may take it for a plan change
                update = shared["update"]
                if update is not None and update.ready:  # between two decode steps
                    shared["update"] = None
                else:
                    update = None
            if update is not None:
                try:
                    update.finish("keep")
                except nereus.Error as e:  # a failed update: the old weights stay
                    print(f"ppo.py: weight update {update.version} failed: {e}", flush=True)
                    continue
                fresh = job.units("actor/generate")  # the old views expired with the old weights
                models = [tp_llama.UnitModel(base.ACTOR, u) for u in fresh]
                versions |= {u.version for u in fresh}
    return torch.cat(seqs), torch.cat([torch.stack(x, 1) for x in lps]), min(versions), max(versions)


def change_plan(job, shared, target):
    """Switches in the staged update (no update may be in flight during a plan change),
    then changes plan beside the generation run in flight. Returns the report."""
    with shared["lock"]:
        update, shared["update"] = shared["update"], None
    if update is not None:
        try:
            update.finish("wait")  # after the generation run in flight
        except nereus.Error:  # a failed update: the transition fills the units from the trainer
            pass
    return job.transition(target)


def run(job, a, gen, trace, batch=16, plen=8, force=None, controller=False):
    """Both streams for a.steps steps; returns ppo.py's JSON body. `force` (step → plan
    changes) and `controller` change plan as ppo.py does, with both streams drained."""
    grpo = a.algorithm == "grpo"
    length, beta, clip, lr = 8, 0.02, 0.2, 3e-3
    shared = {"length": length, "update": None, "lock": threading.Lock()}
    rollouts = queue.Queue()
    failure = []
    transitions, decisions = [], []

    def generation():
        try:
            for k in range(a.steps):
                st = base.Step()
                t0 = time.perf_counter()
                n = batch // base.GROUP if grpo else batch
                prompts = torch.randint(100, base.ACTOR["vocab_size"], (n, plen), generator=gen)
                if grpo:
                    prompts = prompts.repeat_interleave(base.GROUP, 0)
                seqs, behav, oldest, newest = generate(job, st, prompts, shared["length"], gen, shared)
                rollouts.put((k, seqs, behav, oldest, newest, st, t0, time.perf_counter()))
        except BaseException as e:  # handed to the trainer, which re-raises it
            failure.append(e)
            rollouts.put(None)

    # A daemon: when training fails, generation may be waiting in the job for a version that
    # will not come; the error is reported and the process exits without it.
    worker = threading.Thread(target=generation, name="generation", daemon=True)
    origin = time.perf_counter()
    worker.start()
    steps = []
    for k in range(a.steps):
        if True:
            item = rollouts.get()
            if item is None:
                raise failure[0]
            _, seqs, behav_lp, oldest, newest, gst, g0, g1 = item
            st = base.Step()
            t0 = time.perf_counter()
            trainer_version = job.state("actor/train")["policy_version"]
            length = seqs.shape[1] - plen
            resp = seqs[:, plen:]
            numeric = (resp < 100).float()
            score = numeric.mean(1)
            if score.mean().item() > a.grow_at and length < base.MAX_LEN:
                shared["length"] = min(base.MAX_LEN, length + 8)
            prox_lp = base.infer_log_probs(job, st, "actor/infer", seqs, plen, base.ACTOR)
            ref_lp = base.infer_log_probs(job, st, "reference/infer", seqs, plen, base.ACTOR)
            kl = prox_lp - ref_lp
            if grpo:
                g = score.view(-1, base.GROUP)
                adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
                adv_w = adv[:, None].expand_as(prox_lp)
                pl = base.train(job, st, "actor/train", base.ACTOR, seqs,
                                decoupled_policy_loss(plen, prox_lp, behav_lp, adv_w, clip, ref_lp, beta), lr, epochs=2)
                vl = 0.0
            else:
                values = base.infer_values(job, st, seqs, plen)
                rewards = -beta * kl + numeric / resp.shape[1]
                adv, returns = base.gae(rewards, values)
                adv_w = (adv - adv.mean()) / (adv.std() + 1e-8)
                pl = base.train(job, st, "actor/train", base.ACTOR, seqs,
                                decoupled_policy_loss(plen, prox_lp, behav_lp, adv_w, clip), lr, epochs=2)
                vl = base.train(job, st, "critic/train", base.CRITIC, seqs, base.value_loss(plen, values, returns, clip), lr,
                                epochs=2)
            peak = max([d["step_peak"] for d in job.devices()], default=0)
            job.end_step()
            target, trigger, decision = None, None, None
            if force and k in force:
                target, trigger = dict(job.plan, **force[k]), "forced"
            elif controller:
                # This step's stage times (generation's run included) and peak; the next
                # step's response length.
                decision = job.report_step({**gst.seconds, **st.seconds}, length, length, peak_bytes=peak,
                                           next_response_len_mean=shared["length"], next_response_len_p95=shared["length"])
                if decision["replanned"]:
                    decisions.append({key: decision[key] for key in ("step", "trigger", "admitted", "why", "current_seconds",
                                                                     "target_seconds", "transition_seconds",
                                                                     "horizon_steps", "moved_bytes", "decision_ms")}
                                     | {"at_step": k})
                if decision["admitted"]:
                    target, trigger = decision["target"], decision["trigger"]
            if target is not None and target != job.plan:
                began = time.perf_counter()
                report = change_plan(job, shared, target)
                d = decision or {}
                transitions.append({"step": k, "trigger": trigger, "completed": report["completed"], "error": report["error"],
                                    "current_seconds": d.get("current_seconds"), "target_seconds": d.get("target_seconds"),
                                    "transition_seconds": d.get("transition_seconds"),
                                    "horizon_steps": d.get("horizon_steps"), "moved_bytes": report["moved_bytes"],
                                    "copied_bytes": report["copied_bytes"], "seconds": report["seconds"],
                                    "exposed_seconds": time.perf_counter() - began, "plan": job.plan})
                if trace:
                    trace.transition(began, report)
            if shared["update"] is None:  # the new version, staged while generation decodes
                try:
                    staged = job.begin_weight_update("actor/generate")
                    with shared["lock"]:
                        shared["update"] = staged
                except nereus.Error:  # generation already holds it, or the job began one itself
                    pass
            t1 = time.perf_counter()
            if trace:
                trace.step(k, st, t0, t1)
                trace.spans(f"generate {k}", gst, g0, g1)
            steps.append({"step": k, "reward_mean": score.mean().item(), "policy_loss": pl, "value_loss": vl,
                          "kl": kl.mean().item(), "response_len": length, "seconds": t1 - t0,
                          "generate_seconds": g1 - g0, "stage_seconds": st.seconds, "plan": job.plan,
                          "weight_version": oldest, "newest_weight_version": newest,
                          "staleness": trainer_version - oldest,
                          "importance_weight_mean": (prox_lp - behav_lp).exp().clamp(max=IS_CAP).mean().item()})
            if not a.json:
                print(f"step {k:3d} reward {score.mean().item():.3f} len {length:2d} kl {kl.mean().item():+.4f} "
                      f"pl {pl:+.4f} vl {vl:.4f} weights v{oldest}-{newest} staleness {trainer_version - oldest} "
                      f"{t1 - t0:.2f}s", flush=True)
    worker.join()
    update = shared["update"]
    if update is not None:
        update.cancel()  # nothing generates with it any more
    wall = time.perf_counter() - origin
    updates = [{key: r[key] for key in ("weight_version", "seconds", "copy_seconds", "moved_bytes", "paused_seconds",
                                        "pause", "automatic", "started")} | {"version": r["weight_version"]}
               for r in job.weight_updates()]
    if trace:
        for r in job.weight_updates():
            trace.update(r)
    return {"mode": "async", "steps": steps, "transitions": transitions, "decisions": decisions,
            "state_checks": {"passed": 0, "failed": 0}, "weight_updates": updates, "wall_seconds": wall}
