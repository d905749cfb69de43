"""examples/rlhf/tp_llama.py against a dense llama written here independently: the same
log-probabilities from a unit's shards under TP (including tp > kv heads) and PP layouts,
as from the whole tensors gathered by their boxes. Usage: test_rlhf_model.py EXAMPLES_DIR"""
import json
import os
import sys
import unittest

import torch

import nereus

sys.path.insert(0, sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..",
                                                                              "examples", "rlhf"))
import tp_llama  # noqa: E402

BASE = {
    "actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "actor/train": "tp=1,pp=1,dp=1,devices=4",
    "critic/train": "tp=4,pp=1,dp=1,devices=0-3",
}
CONFIG = os.path.join(os.path.dirname(__file__), "..", "presets", "models", "tiny-llama.json")


def dense_log_probs(cfg, w, ids, targets):
    """Hugging Face llama, whole tensors, f32."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = cfg.get("head_dim", H // nh), cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    n = ids.shape[0]

    def norm(x, g):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    inv = theta ** (-torch.arange(0, hd, 2).float() / hd)
    f = torch.outer(torch.arange(n).float(), inv)
    cos, sin = torch.cat([f.cos(), f.cos()], -1), torch.cat([f.sin(), f.sin()], -1)

    def rot(x):  # [heads, n, hd]
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = norm(x, w[p + "input_layernorm.weight"])
        q = rot((a @ w[p + "self_attn.q_proj.weight"].T).view(n, nh, hd).transpose(0, 1))
        k = rot((a @ w[p + "self_attn.k_proj.weight"].T).view(n, nkv, hd).transpose(0, 1))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        s = q @ k.transpose(1, 2) / hd ** 0.5
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(n, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = norm(x, w[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    logits = norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    return logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]


class TensorParallelForward(unittest.TestCase):
    def test_every_layout_matches_the_dense_model(self):
        with open(CONFIG) as f:
            cfg = json.load(f)
        job = nereus.Job("ppo-tiny", BASE, devices=8, capacity="64MiB")
        # Random weights written through the tp=1 unit's shards (each tensor whole there).
        g = torch.Generator().manual_seed(5)
        for s in job.units("actor/train")[0].shards(slot="param"):
            scale = 1.0 if s.tensor.endswith("norm.weight") else 0.08
            base = 1.0 if s.tensor.endswith("norm.weight") else 0.0
            s.data.copy_(base + scale * torch.randn(s.shape, generator=g))
        whole = {s.tensor: s.data.float().clone() for s in job.units("actor/train")[0].shards(slot="param")}
        ids = torch.randint(0, cfg["vocab_size"], (12,), generator=g)
        targets = torch.randint(0, cfg["vocab_size"], (12,), generator=g)
        want = dense_log_probs(cfg, whole, ids, targets)
        for layout in ("tp=1,pp=1,dp=1,devices=4", "tp=2,pp=1,dp=1,devices=4-5", "tp=4,pp=1,dp=1,devices=4-7",
                       "tp=8,pp=1,dp=1,devices=0-7", "tp=2,pp=2,dp=1,devices=4-7", "tp=1,pp=3,dp=1,devices=4-6",
                       "tp=2,pp=3,dp=1,devices=2-7"):
            with self.subTest(layout=layout):
                target = dict(BASE, **{"actor/train": layout})
                if "devices=0-7" in layout:
                    target = {k: "tp=8,pp=1,dp=1,devices=0-7" if k.endswith("train") else
                              "tp=1,pp=1,dp=1,devices=0" for k in BASE}
                elif "devices=2-7" in layout:
                    target["critic/train"] = "tp=2,pp=1,dp=1,devices=0-1"
                r = job.transition(target)
                self.assertTrue(r["completed"], r)
                unit = job.units("actor/train")[0]
                self.assertEqual(unit.layout.split(",")[:2], layout.split(",")[:2])
                got = tp_llama.UnitModel(cfg, unit).log_probs(ids, targets)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                job.transition(BASE)


class KVCacheDecoding(unittest.TestCase):
    def test_incremental_decoding_matches_the_full_forward(self):
        """Prefill, then one token at a time through the cache: the last hidden state as
        from the whole sequence at once, up to the cache's bf16 rounding of k and v."""
        with open(CONFIG) as f:
            cfg = json.load(f)
        job = nereus.Job("ppo-tiny", BASE, devices=8, capacity="64MiB")
        g = torch.Generator().manual_seed(7)
        for s in job.units("actor/train")[0].shards(slot="param"):
            s.data.copy_((1.0 if s.tensor.endswith("norm.weight") else 0.0) + 0.08 * torch.randn(s.shape, generator=g))
        ids = torch.randint(0, cfg["vocab_size"], (3, 10), generator=g)
        for layout in ("tp=1,pp=1,dp=1,devices=4", "tp=2,pp=2,dp=1,devices=4-7", "tp=4,pp=1,dp=1,devices=4-7"):
            with self.subTest(layout=layout):
                self.assertTrue(job.transition(dict(BASE, **{"actor/train": layout}))["completed"])
                m = tp_llama.UnitModel(cfg, job.units("actor/train")[0])
                want = m.hidden(ids)[:, -1]
                given = {}
                cache = tp_llama.KVCache(m, 3, 10, lambda d, n: given.setdefault(d, torch.empty(n, dtype=torch.uint8)))
                h = m.hidden(ids[:, :4], 0, cache)
                for t in range(4, 10):
                    h = m.hidden(ids[:, t:t + 1], t, cache)
                torch.testing.assert_close(h[:, -1], want, rtol=3e-2, atol=3e-2)
                # Each device's share: k and v of its layers and kv heads, bf16.
                tp, pp = int(layout[3]), int(layout[8])
                kvh = max(1, cfg["num_key_value_heads"] // tp)
                layers = -(-cfg["num_hidden_layers"] // pp)
                self.assertEqual(tp_llama.KVCache.nbytes(m, 3, 10), 2 * 2 * 3 * kvh * 10 * cfg["head_dim"] * layers)
                self.assertEqual(len(given), tp * pp)


if __name__ == "__main__":
    unittest.main(verbosity=2)
