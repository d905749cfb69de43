"""A llama decoder computed over one Nereus unit's shards, for real: tensor parallelism
across the unit's TP ranks and pipeline parallelism across its PP stages, on the shards'
own memory (no weight is gathered).

- Column-parallel q/k/v and gate/up: each rank computes its heads / its slice of the
  intermediate dimension from its rows.
- Row-parallel o_proj and down_proj: each rank multiplies by its column slice; the
  partial results are summed across the ranks (the all-reduce).
- Vocab-parallel embedding and lm_head: each rank looks up or scores its vocabulary
  rows; lookups are summed, and log-probabilities are normalised across the ranks
  (max and sum of exponentials reduced, never the whole vocabulary in one tensor).
- Pipeline stages run one after another, handing the hidden state on.

On CPUs the ranks of a TP group run one after another in this process. Issue 13's PPO
job (examples/rlhf/ppo.py) builds on this module.
"""
import math

import torch


def rms_norm(x, weight, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def rope(x, positions, theta):
    """Rotary embedding (the Hugging Face llama convention: halves rotated)."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = positions.float()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Rank:
    """The shards one device holds for one unit: tensor name -> (box, tensor)."""

    def __init__(self, shards, slot_dtype=torch.float32):
        self.t = {s.tensor: (s.box, s.data) for s in shards}
        self.dtype = slot_dtype

    def w(self, name):
        return self.t[name][1].to(self.dtype)

    def rows(self, name):
        return self.t[name][0][0]

    def has(self, name):
        return name in self.t


class UnitModel:
    """Forward passes over one unit of a model-stage (its param slot, or `slot`)."""

    def __init__(self, config, unit, slot="param"):
        self.c = config
        self.nh = config["num_attention_heads"]
        self.nkv = config.get("num_key_value_heads", self.nh)
        self.hd = config.get("head_dim", config["hidden_size"] // self.nh)
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.theta = config.get("rope_theta", 10000.0)
        self.layout = dict(kv.split("=") for kv in unit.layout.split(","))
        self.tp, self.pp = int(self.layout["tp"]), int(self.layout["pp"])
        by_device = {}
        for s in unit.shards(slot=slot):
            by_device.setdefault(s.device, []).append(s)
        # R[s·tp + r] is the device of pipeline stage s, rank r.
        self.stages = [[Rank(by_device.get(unit.devices[s * self.tp + r], []))
                        for r in range(self.tp)] for s in range(self.pp)]

    def layers_of(self, stage):
        ranks = self.stages[stage]
        layers = set()
        for name in ranks[0].t:
            if name.startswith("model.layers."):
                layers.add(int(name.split(".")[2]))
        return sorted(layers)

    def embed(self, ids):
        """Vocab-parallel lookup: each rank its rows, summed."""
        out = None
        for rank in self.stages[0]:
            lo, hi = rank.rows("model.embed_tokens.weight")
            local = ids - lo
            hit = (ids >= lo) & (ids < hi)
            part = rank.w("model.embed_tokens.weight")[local.clamp(0, hi - lo - 1)] * hit[..., None]
            out = part if out is None else out + part
        return out

    def attention(self, ranks, layer, x, positions):
        p = f"model.layers.{layer}.self_attn."
        seq = x.shape[0]
        out = None
        mask = torch.full((seq, seq), float("-inf")).triu(1)
        for rank in ranks:
            q = x @ rank.w(p + "q_proj.weight").T
            k = x @ rank.w(p + "k_proj.weight").T
            v = x @ rank.w(p + "v_proj.weight").T
            q_lo = rank.rows(p + "q_proj.weight")[0] // self.hd
            kv_lo = rank.rows(p + "k_proj.weight")[0] // self.hd
            heads = q.shape[-1] // self.hd
            q = rope(q.view(seq, heads, self.hd).transpose(0, 1), positions, self.theta)
            kvh = k.shape[-1] // self.hd
            k = rope(k.view(seq, kvh, self.hd).transpose(0, 1), positions, self.theta)
            v = v.view(seq, kvh, self.hd).transpose(0, 1)
            group = self.nh // self.nkv
            # Each local q head h (global q_lo + h) reads kv head (q_lo + h) // group.
            kv_index = torch.tensor([(q_lo + h) // group - kv_lo for h in range(heads)])
            scores = q @ k[kv_index].transpose(1, 2) / math.sqrt(self.hd) + mask
            ctx = torch.softmax(scores, -1) @ v[kv_index]
            ctx = ctx.transpose(0, 1).reshape(seq, heads * self.hd)
            part = ctx @ rank.w(p + "o_proj.weight").T  # row-parallel: partial sums
            out = part if out is None else out + part
        return out

    def mlp(self, ranks, layer, x):
        p = f"model.layers.{layer}.mlp."
        out = None
        for rank in ranks:
            h = torch.nn.functional.silu(x @ rank.w(p + "gate_proj.weight").T) * (x @ rank.w(p + "up_proj.weight").T)
            part = h @ rank.w(p + "down_proj.weight").T
            out = part if out is None else out + part
        return out

    def hidden(self, ids):
        """Final hidden states [seq, H] of one sequence of token ids."""
        positions = torch.arange(ids.shape[0])
        x = self.embed(ids)
        for s in range(self.pp):  # the pipeline: stage s hands x to stage s + 1
            ranks = self.stages[s]
            for layer in self.layers_of(s):
                p = f"model.layers.{layer}."
                x = x + self.attention(ranks, layer, rms_norm(x, ranks[0].w(p + "input_layernorm.weight"), self.eps),
                                       positions)
                x = x + self.mlp(ranks, layer, rms_norm(x, ranks[0].w(p + "post_attention_layernorm.weight"), self.eps))
        last = self.stages[-1]
        return rms_norm(x, last[0].w("model.norm.weight"), self.eps)

    def logit_slices(self, h):
        """Vocab-parallel lm_head: [(vocab_lo, logits [seq, slice])] per rank of the last stage."""
        head = "lm_head.weight" if self.stages[-1][0].has("lm_head.weight") else "model.embed_tokens.weight"
        return [(rank.rows(head)[0], h @ rank.w(head).T) for rank in self.stages[-1]]

    def log_probs(self, ids, targets):
        """log p(targets[i] | ids[:i+1]) without forming the whole vocabulary's logits."""
        slices = self.logit_slices(self.hidden(ids))
        top = torch.stack([z.max(-1).values for _, z in slices]).max(0).values  # reduced max
        norm = sum((z - top[:, None]).exp().sum(-1) for _, z in slices)        # reduced sum
        picked = torch.zeros_like(top)
        for lo, z in slices:
            local = targets - lo
            hit = (local >= 0) & (local < z.shape[-1])
            picked = picked + z.gather(-1, local.clamp(0, z.shape[-1] - 1)[:, None])[:, 0] * hit
        return picked - top - norm.log()
