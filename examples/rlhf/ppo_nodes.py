#!/usr/bin/python3
"""PPO across processes: each process is one node of a Nereus cluster (nereus.Member) and
computes on the units of its devices, whose first memory is the process's own model
tensors (adopt=); the coordinator holds the plan, syncs the trained
weights to generation and inference after each step, and runs the transitions between
steps. DP replicas sit on different nodes: rollouts and inference results are gathered,
and gradients all-reduced, with torch.distributed over gloo. The math is ppo.py's (same
task, losses, GAE and Adam), with randomness fixed per step and replica, so a run whose
units move between nodes (same layouts) computes bit for bit what a run that stays
computes.

Rank 0 is the coordinator (its Member listens on --coordinator). Two nodes of 4 host
devices on one machine (docs/cluster.md, "A framework as a node"):

  umask 077; head -c 32 /dev/urandom | base64 > token
  for r in 0 1; do PYTHONPATH=build/python examples/rlhf/ppo_nodes.py --coordinator 127.0.0.1:7000 \\
      --rank $r --nodes 2 --token-file token --gloo 127.0.0.1:29500 \\
      --plan examples/rlhf/ppo-nodes-plan.json & done
  build/src/nereus cluster job --coordinator 127.0.0.1:7000 --token-file token \\
      --job examples/rlhf/ppo-tiny-rule.json --plan examples/rlhf/ppo-nodes-plan.json \\
      [--to examples/rlhf/ppo-nodes-moved.json] --node-steps --steps 20 --no-verify

Each unit must lie inside one node (a TP group across processes is not computed here).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nereus  # noqa: E402
import ppo  # noqa: E402  (the math: losses, GAE)
import state_check  # noqa: E402
import tp_llama  # noqa: E402

ACTOR, CRITIC = ppo.ACTOR, ppo.CRITIC
PLEN, BATCH = 8, 16
BETA, CLIP, LR, EPOCHS = 0.02, 0.2, 3e-3, 2
CHECKED = ("actor/train", "critic/train", "reference/infer")  # --check-state: what transitions must keep


def fnv(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
    return h


def generator(*key):
    """Randomness fixed by what it is for (seed, step, replica, ...), not by who runs it."""
    return torch.Generator().manual_seed(fnv("/".join(map(str, key))) % 2**63)


class Node:
    """This process's view of one step: its units by model-stage, and the DP degrees."""

    def __init__(self, step, rank, per_node):
        self.step, self.dp, self.units = step, dict(step.replicas), {}
        mine = range(rank * per_node, (rank + 1) * per_node)
        for u in step.units:
            if any(d not in mine for d in u.devices):
                raise SystemExit(f"ppo_nodes.py: {u.model_stage} replica {u.replica} spans nodes ({u.devices}); "
                                 "this example computes each unit inside one process")
            self.units.setdefault(u.model_stage, []).append(u)
        for us in self.units.values():
            us.sort(key=lambda u: u.replica)
        self.seconds = {}

    def of(self, stage):
        return self.units.get(stage, [])

    def timed(self, stage, t0):
        if self.of(stage):
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


def gather(pieces):
    """{replica: rows} from every process, concatenated in replica order."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, pieces)
    merged = {}
    for p in everyone:
        merged.update(p)
    return torch.cat([merged[r] for r in sorted(merged)])


def all_sum(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def own_model(job, plan, rank, per_node, nodes, capacity, seed):
    """The model tensors this process holds for its node's units of the first plan, as
    adopt= entries: small random weights (norms: ones; other slots zero), each tensor drawn
    whole from a generator of its own and sliced by the shard's box, so every process
    holds the same values in its copies. A probe job (never joined) lays out the plan."""
    probe = nereus.Job(job, plan, devices=per_node * nodes, capacity=capacity)
    shapes = {}
    for stage in probe.model_stages:
        src = "actor" if stage.startswith("reference/") else stage.split("/")[0]
        for u in probe.units(stage):
            for s in u.shards(slot="param"):
                k = (src, s.tensor)
                shapes[k] = [max(a, hi) for a, (_, hi) in zip(shapes.get(k, [0] * len(s.box)), s.box)]
    entries, mine = [], range(rank * per_node, (rank + 1) * per_node)
    with torch.no_grad():
        for stage in probe.model_stages:
            src = "actor" if stage.startswith("reference/") else stage.split("/")[0]
            for u in probe.units(stage):
                for s in u.shards(slot=None):
                    if s.device not in mine:
                        continue
                    t = torch.zeros_like(s.data)
                    if s.slot in ("param", "master"):
                        shape = shapes[(src, s.tensor)]
                        full = torch.ones(shape) if s.tensor.endswith("norm.weight") else \
                            0.02 * torch.randn(shape, generator=generator(seed, src, s.tensor))
                        t.copy_(full[tuple(slice(lo, hi) for lo, hi in s.box)])
                    entries.append({"stage": stage, "replica": u.replica, "device": s.device, "buffer": s.tensor,
                                    "slot": s.slot, "tensor": t})
    return entries


def generate(node, prompts, length, seed, k):
    stage, pieces, t0 = "actor/generate", {}, time.perf_counter()
    with torch.no_grad():
        for u in node.of(stage):
            m = tp_llama.UnitModel(ACTOR, u)
            part = prompts[ppo.split(len(prompts), node.dp[stage], u.replica)]
            cache = tp_llama.KVCache(m, len(part), PLEN + length, lambda d, n: torch.zeros(n, dtype=torch.uint8))
            gen = generator(seed, "sample", k, u.replica)
            h, seq = m.hidden(part, 0, cache), part
            for t in range(length):
                tok = m.sample(h[:, -1], gen)
                seq = torch.cat([seq, tok[:, None]], 1)
                if t + 1 < length:
                    h = m.hidden(tok[:, None], seq.shape[1] - 1, cache)
            pieces[u.replica] = seq
    node.timed(stage, t0)
    return gather(pieces)


def infer(node, stage, seqs, cfg, values=False):
    pieces, t0 = {}, time.perf_counter()
    with torch.no_grad():
        for u in node.of(stage):
            m = tp_llama.UnitModel(cfg, u)
            part = seqs[ppo.split(len(seqs), node.dp[stage], u.replica)]
            h = m.hidden(part[:, :-1])
            pieces[u.replica] = m.values(h)[:, PLEN - 1:, 0] if values else m.token_log_probs(h[:, PLEN - 1:], part[:, PLEN:])
    node.timed(stage, t0)
    return gather(pieces)


def adam(node, stage, models, t, beta1=0.9, beta2=0.999, eps=1e-8):
    """ppo.py's Adam, with the gradient sum across copies of a parameter (TP-replicated
    tensors, DP replicas) taken over every process: local copies first, then one gloo
    all-reduce of all of them."""
    groups = {}
    for m in models:
        for shard, leaf in m.leaves():
            groups.setdefault((shard.tensor, tuple(shard.box)), []).append((shard, leaf))
    local = {key: torch.stack([leaf.grad for _, leaf in c]).sum(0) if len(c) > 1 else c[0][1].grad
             for key, c in groups.items() if all(leaf.grad is not None for _, leaf in c)}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted((key, list(g.shape)) for key, g in local.items()))
    keys = sorted({(key, tuple(shape)) for p in everyone for key, shape in p})
    flat = torch.cat([local[key].flatten() if key in local else torch.zeros(shape).flatten() for key, shape in keys]) \
        if keys else torch.zeros(0)
    dist.all_reduce(flat)
    params = {}
    for u in node.of(stage):
        for s in u.shards(slot=None):
            params[(s.device, s.tensor, s.slot, tuple(s.box))] = s
    offset = 0
    with torch.no_grad():
        for key, shape in keys:
            n = torch.Size(shape).numel()
            g = flat[offset:offset + n].view(shape)
            offset += n
            for shard, leaf in groups.get(key, []):
                m1 = params[(shard.device, key[0], "exp_avg", key[1])].data
                m2 = params[(shard.device, key[0], "exp_avg_sq", key[1])].data
                m1.mul_(beta1).add_(g, alpha=1 - beta1)
                m2.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                leaf.addcdiv_(m1, m2.sqrt().add_(eps), value=-LR * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t))
                params[(shard.device, key[0], "param", key[1])].data.copy_(leaf)


def train(node, stage, cfg, seqs, loss_of, t):
    losses, t0 = [], time.perf_counter()
    for _ in range(EPOCHS):
        models, total = [], 0.0
        for u in node.of(stage):
            m = tp_llama.UnitModel(cfg, u, train=True)
            rows = ppo.split(len(seqs), node.dp[stage], u.replica)
            loss = loss_of(m, seqs[rows], rows)
            loss.backward()
            total += loss.item()
            models.append(m)
        adam(node, stage, models, t)
        losses.append(all_sum(total))
    node.timed(stage, t0)
    return sum(losses) / len(losses)


def checked_state(node):
    """Every checked stage's slots by box, from every process."""
    mine = {}
    for stage in CHECKED:
        state_check.state_of(stage, node.of(stage), mine)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out = {}
    for p in everyone:
        for key, boxes in p.items():
            out.setdefault(key, {}).update(boxes)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", required=True, help="HOST:PORT; rank 0 listens there as the coordinator")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--gloo", required=True, help="HOST:PORT for torch.distributed's rendezvous (rank 0 listens)")
    ap.add_argument("--plan", required=True, help="the job's first plan (the coordinator's --plan): this process's model "
                    "tensors are its node's units of it")
    ap.add_argument("--job", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo-tiny-rule.json"),
                    help="the job file (default: ppo-tiny-rule.json beside this script)")
    ap.add_argument("--devices", type=int, default=4, help="host devices per node (default 4)")
    ap.add_argument("--capacity", default="64MiB", help="bytes per device (default 64MiB)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check-state", action="store_true",
                    help="after each transition, compare the training and reference state bit for bit, across nodes")
    ap.add_argument("--out", help="write each step as a JSON line here")
    a = ap.parse_args()
    model = own_model(a.job, a.plan, a.rank, a.devices, a.nodes, a.capacity, a.seed)
    owned = {e["tensor"].data_ptr() for e in model}
    member = nereus.Member(coordinator=a.coordinator, rank=a.rank, nodes=a.nodes, token_file=a.token_file,
                           devices=a.devices, capacity=a.capacity, adopt=model)
    dist.init_process_group("gloo", init_method=f"tcp://{a.gloo}", rank=a.rank, world_size=a.nodes)
    out = open(a.out, "w") if a.out else None
    length, before, ids, checks = 8, None, None, {"passed": 0, "failed": 0}
    for k, step in enumerate(member.steps(), start=1):
        t0 = time.perf_counter()
        node = Node(step, a.rank, a.devices)
        now = sorted((u.model_stage, u.id) for u in step.units)
        moved = ids is not None and now != ids
        ids = now
        shards = [s for u in step.units for s in u.shards(slot=None)]
        adopted = sum(s.data_ptr in owned for s in shards)  # step 1: all of them, the process's own tensors
        if a.check_state and moved:
            bad = state_check.same_state(before, checked_state(node), set(CHECKED))
            checks["failed" if bad else "passed"] += 1
            if bad:
                print("check-state:", bad, file=sys.stderr)
        prompts = torch.randint(100, ACTOR["vocab_size"], (BATCH, PLEN), generator=generator(a.seed, "prompts", k))
        seqs = generate(node, prompts, length, a.seed, k)
        resp = seqs[:, PLEN:]
        numeric = (resp < 100).float()
        score = numeric.mean(1)
        old_lp = infer(node, "actor/infer", seqs, ACTOR)
        ref_lp = infer(node, "reference/infer", seqs, ACTOR)
        values = infer(node, "critic/infer", seqs, CRITIC, values=True)
        kl = old_lp - ref_lp
        rewards = -BETA * kl + numeric / resp.shape[1]
        adv, returns = ppo.gae(rewards, values)
        adv_w = (adv - adv.mean()) / (adv.std() + 1e-8)
        pl = train(node, "actor/train", ACTOR, seqs, ppo.policy_loss(PLEN, old_lp, adv_w, CLIP), k)
        vl = train(node, "critic/train", CRITIC, seqs, ppo.value_loss(PLEN, values, returns, CLIP), k)
        if a.check_state:
            before = checked_state(node)
        row = {"step": k, "reward_mean": score.mean().item(), "policy_loss": pl, "value_loss": vl, "kl": kl.mean().item(),
               "response_len": length, "seconds": time.perf_counter() - t0, "stage_seconds": node.seconds,
               "units": {s: [[u.replica, list(u.devices)] for u in us] for s, us in sorted(node.units.items())},
               "shards": len(shards), "adopted_shards": adopted,
               "state_checks": dict(checks)}
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        if a.rank == 0:
            print(f"step {k:3d} reward {row['reward_mean']:.3f} len {length:2d} kl {row['kl']:+.4f} pl {pl:+.4f} "
                  f"vl {vl:.4f} {row['seconds']:.2f}s{'  (after a transition)' if moved else ''}", flush=True)
        member.report(stage_seconds=node.seconds, response_len_mean=length, response_len_p95=length)
        length = length + 8 if score.mean().item() > ppo.GROW_AT and length < ppo.MAX_LEN else length
    dist.destroy_process_group()
    print(f"rank {a.rank}: state checks {checks['passed']} passed, {checks['failed']} failed", file=sys.stderr)
    return 1 if checks["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
