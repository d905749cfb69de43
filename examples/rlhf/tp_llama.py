"""A llama decoder computed over one Nereus unit's shards, for real: tensor parallelism
across the unit's TP ranks and pipeline parallelism across its PP stages, on the shards'
own memory (no weight is gathered, except FSDP's chunks of a rank, which are).

- Column-parallel q/k/v and gate/up: each rank computes its heads / its slice of the
  intermediate dimension from its rows.
- Row-parallel o_proj and down_proj: each rank multiplies by its column slice; the
  partial results are summed across the ranks (the all-reduce).
- Vocab-parallel embedding and lm_head: each rank looks up or scores its vocabulary
  rows; lookups are summed, and log-probabilities are normalised across the ranks
  (max and sum of exponentials reduced, never the whole vocabulary in one tensor).
- Pipeline stages run one after another, handing the hidden state on.
- Batched, with a KV cache for incremental decoding, sampling per vocabulary slice
  (Gumbel-max), a score head for value models, and training units whose master slot
  (f32) is the autograd leaf the optimizer updates in place.

On CPUs the ranks of a TP group run one after another in this process. Issue 13's PPO
job (examples/rlhf/ppo.py) builds on this module.
"""
import math

import torch


def rms_norm(x, weight, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def rope(x, positions, theta):
    """Rotary embedding (the Hugging Face llama convention: halves rotated); x [..., n, hd]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = positions.float()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Rank:
    """The shards of one TP rank of one unit: tensor name -> (box, f32 tensor). Without
    FSDP they are one device's; with FSDP (fsdp=F) each device holds a dim-0 chunk of the
    rank's TP box, and the rank's tensor is the chunks gathered in order (the all-gather)."""

    def __init__(self, chunks, train):
        self.t = {}
        self.leaves = []  # (shard, leaf) of a training unit
        parts = {}
        for shards in chunks:  # one list of shards per FSDP chunk, in chunk order
            for s in shards:
                if train:
                    # The master slot itself, as a leaf: backward fills .grad, the optimizer
                    # updates it in place (examples/rlhf/ppo.py).
                    x = s.data.detach().requires_grad_()
                    self.leaves.append((s, x))
                else:
                    x = s.data.float()
                parts.setdefault(s.tensor, []).append((s.box, x))
        for name, ps in parts.items():
            if len(ps) == 1:
                self.t[name] = ps[0]
                continue
            # FSDP: the chunks' rows are consecutive, so the rank's box spans them; autograd
            # hands each chunk the gradient of its rows (the reduce-scatter).
            box = [(ps[0][0][0][0], ps[-1][0][0][1])] + [tuple(d) for d in ps[0][0][1:]]
            self.t[name] = (box, torch.cat([x for _, x in ps], 0))

    def w(self, name):
        return self.t[name][1]

    def rows(self, name):
        return self.t[name][0][0]

    def has(self, name):
        return name in self.t


class UnitModel:
    """Forward passes over one unit of a model-stage: its param slot (bf16, converted once
    to f32), or with train=True its master slot (f32) as leaves that collect gradients."""

    def __init__(self, config, unit, train=False):
        self.c = config
        self.nh = config["num_attention_heads"]
        self.nkv = config.get("num_key_value_heads", self.nh)
        self.hd = config.get("head_dim", config["hidden_size"] // self.nh)
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.theta = config.get("rope_theta", 10000.0)
        self.layout = dict(kv.split("=") for kv in unit.layout.split(","))
        self.tp, self.pp = int(self.layout["tp"]), int(self.layout["pp"])
        self.fsdp = int(self.layout.get("fsdp", 1))
        self.devices = list(unit.devices)
        by_device = {}
        for s in unit.shards(slot="master" if train else "param"):
            by_device.setdefault(s.device, []).append(s)
        # R[(s·fsdp + f)·tp + r] is the device of pipeline stage s, FSDP chunk f, rank r.
        self.stages = [[Rank([by_device.get(unit.devices[(s * self.fsdp + f) * self.tp + r], []) for f in range(self.fsdp)],
                             train)
                        for r in range(self.tp)] for s in range(self.pp)]
        self.layers = []
        for s in range(self.pp):
            names = self.stages[s][0].t
            self.layers.append(sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")}))

    def leaves(self):
        return [pair for stage in self.stages for rank in stage for pair in rank.leaves]

    def embed(self, ids):
        """Vocab-parallel lookup: each rank its rows, summed."""
        out = None
        for rank in self.stages[0]:
            lo, hi = rank.rows("model.embed_tokens.weight")
            hit = (ids >= lo) & (ids < hi)
            part = rank.w("model.embed_tokens.weight")[(ids - lo).clamp(0, hi - lo - 1)] * hit[..., None]
            out = part if out is None else out + part
        return out

    def attention(self, ranks, layer, x, positions, cache):
        """x [B, n, H]; cache: a KVCache holding earlier positions, or None."""
        p = f"model.layers.{layer}.self_attn."
        b, n, _ = x.shape
        total = positions[-1].item() + 1
        mask = torch.full((n, total), float("-inf")).triu(total - n + 1)
        group = self.nh // self.nkv
        out = None
        for r, rank in enumerate(ranks):
            q = x @ rank.w(p + "q_proj.weight").T
            k = x @ rank.w(p + "k_proj.weight").T
            v = x @ rank.w(p + "v_proj.weight").T
            heads, kvh = q.shape[-1] // self.hd, k.shape[-1] // self.hd
            q = rope(q.view(b, n, heads, self.hd).transpose(1, 2), positions, self.theta)
            k = rope(k.view(b, n, kvh, self.hd).transpose(1, 2), positions, self.theta)
            v = v.view(b, n, kvh, self.hd).transpose(1, 2)
            if cache is not None:
                k, v = cache.extend(layer, r, positions[0].item(), k, v)
            q_lo = rank.rows(p + "q_proj.weight")[0] // self.hd
            kv_lo = rank.rows(p + "k_proj.weight")[0] // self.hd
            # Local q head h (global q_lo + h) reads kv head (q_lo + h) // group.
            pick = torch.tensor([(q_lo + h) // group - kv_lo for h in range(heads)])
            scores = q @ k[:, pick].transpose(2, 3) / math.sqrt(self.hd) + mask
            ctx = (torch.softmax(scores, -1) @ v[:, pick]).transpose(1, 2).reshape(b, n, heads * self.hd)
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

    def hidden(self, ids, start=0, cache=None):
        """Final hidden states [B, n, H] of token ids [B, n] at positions start.., with a
        KV cache (KVCache) for incremental decoding."""
        positions = torch.arange(start, start + ids.shape[-1])
        x = self.embed(ids)
        for s in range(self.pp):  # the pipeline: stage s hands x to stage s + 1
            ranks = self.stages[s]
            for layer in self.layers[s]:
                p = f"model.layers.{layer}."
                x = x + self.attention(ranks, layer, rms_norm(x, ranks[0].w(p + "input_layernorm.weight"), self.eps),
                                       positions, cache)
                x = x + self.mlp(ranks, layer, rms_norm(x, ranks[0].w(p + "post_attention_layernorm.weight"), self.eps))
        return rms_norm(x, self.stages[-1][0].w("model.norm.weight"), self.eps)

    def logit_slices(self, h):
        """Vocab-parallel lm_head: [(vocab_lo, logits [..., slice])] per rank of the last stage."""
        head = "lm_head.weight" if self.stages[-1][0].has("lm_head.weight") else "model.embed_tokens.weight"
        return [(rank.rows(head)[0], h @ rank.w(head).T) for rank in self.stages[-1]]

    def values(self, h):
        """A score head's outputs [..., num_labels] (replicated on the last stage)."""
        return h @ self.stages[-1][0].w("score.weight").T

    def token_log_probs(self, h, targets):
        """log p(targets) from hidden states, normalised across the vocabulary slices."""
        slices = self.logit_slices(h)
        top = torch.stack([z.max(-1).values for _, z in slices]).max(0).values.detach()  # reduced max
        norm = sum((z - top[..., None]).exp().sum(-1) for _, z in slices)                # reduced sum
        picked = torch.zeros_like(top)
        for lo, z in slices:
            local = targets - lo
            hit = (local >= 0) & (local < z.shape[-1])
            picked = picked + z.gather(-1, local.clamp(0, z.shape[-1] - 1)[..., None])[..., 0] * hit
        return picked - top - norm.log()

    def log_probs(self, ids, targets):
        """log p(targets[i] | ids[:i+1]) of one sequence, without whole-vocabulary logits."""
        return self.token_log_probs(self.hidden(ids[None]), targets[None])[0]

    def sample(self, h, generator, temperature=1.0):
        """One token per row from the last position's vocabulary slices (Gumbel-max per
        slice, then the best slice: the same as sampling the whole softmax)."""
        best, best_tok = None, None
        for lo, z in self.logit_slices(h):
            u = torch.rand(z.shape, generator=generator).clamp_(1e-10, 1.0)
            g = z / temperature - torch.log(-torch.log(u))
            val, idx = g.max(-1)
            tok = idx + lo
            if best is None:
                best, best_tok = val, tok
            else:
                take = val > best
                best, best_tok = torch.where(take, val, best), torch.where(take, tok, best_tok)
        return best_tok


class KVCache:
    """Keys and values of earlier positions for one unit, per (layer, TP rank), in bf16
    storage that each device provides up front — a Nereus unit's workspace, so the cache
    counts against the device's capacity as it would on a GPU. Reads are converted to f32.

    Per device: 2 (k, v) × its layers × batch × its kv heads × length × head_dim × 2 bytes.
    """

    def __init__(self, model, batch, length, storage):
        """storage(device, nbytes) -> a uint8 tensor of at least nbytes."""
        self.k, self.v = {}, {}
        for s in range(model.pp):
            for r, rank in enumerate(model.stages[s]):
                layers = model.layers[s]
                kvh = self.kv_heads(model, rank, layers)
                per = batch * kvh * length * model.hd
                buf = storage(model.devices[s * model.tp + r], 4 * per * len(layers)).view(torch.bfloat16)
                for j, layer in enumerate(layers):
                    self.k[(layer, r)] = buf[2 * j * per:(2 * j + 1) * per].view(batch, kvh, length, model.hd)
                    self.v[(layer, r)] = buf[(2 * j + 1) * per:(2 * j + 2) * per].view(batch, kvh, length, model.hd)

    @staticmethod
    def kv_heads(model, rank, layers):
        if not layers:
            return 0
        lo, hi = rank.rows(f"model.layers.{layers[0]}.self_attn.k_proj.weight")
        return (hi - lo) // model.hd

    @staticmethod
    def nbytes(model, batch, length):
        """The most any one device of the unit needs."""
        return max(4 * batch * KVCache.kv_heads(model, rank, model.layers[s]) * length * model.hd * len(model.layers[s])
                   for s in range(model.pp) for rank in model.stages[s])

    def extend(self, layer, rank, start, k, v):
        """Stores k, v [B, kvh, n, hd] at positions start.. and returns every position's so far."""
        kc, vc = self.k[(layer, rank)], self.v[(layer, rank)]
        end = start + k.shape[2]
        kc[:, :, start:end] = k
        vc[:, :, start:end] = v
        return kc[:, :, :end].float(), vc[:, :, :end].float()
