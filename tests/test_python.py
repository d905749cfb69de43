"""The Python module against a real embedded job: zero-copy shards, round trips through
transitions compared bit for bit, framework-owned tensors as units, bad input as
exceptions, a busy Python stage that does not stall a transition, the live controller,
weights and checkpoints. Run by meson with Debian's python3 and python3-torch."""
import asyncio
import json
import os
import struct
import sys
import tempfile
import threading
import time
import unittest

import torch

import nereus

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_torch import dequantize, element_scales, within_rounding  # noqa: E402

JOB = "ppo-tiny"
BASE = {
    "actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
    "critic/train": "tp=4,pp=1,dp=1,devices=4-7",
}
SLOTS = ["param", "master", "exp_avg", "exp_avg_sq"]
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def plan(**changes):
    p = dict(BASE)
    p.update({k.replace("__", "/"): v for k, v in changes.items()})
    return p


def new_job(**kw):
    kw.setdefault("devices", 8)
    kw.setdefault("capacity", "64MiB")
    return nereus.Job(JOB, kw.pop("plan", BASE), **kw)


def shape_of(p, stage, tensor):
    """The full shape of `tensor` in a job on plan p, from its shards' boxes."""
    ends = [s.box for u in new_job(plan=p).units(stage) for s in u.shards() if s.tensor == tensor]
    return tuple(max(b[d][1] for b in ends) for d in range(len(ends[0])))


def grpo_spec(d, model, prompts_per_step):
    """A GRPO job file in directory d whose actor and reference are `model`, with a rule reward."""
    path = os.path.join(d, "grpo.json")
    with open(path, "w") as f:
        json.dump({"algorithm": "grpo", "prompts_per_step": prompts_per_step, "samples_per_prompt": 2, "prompt_len": 16,
                   "max_response_len": 32, "models": {"actor": model, "reference": model, "reward": "rule"}}, f)
    return path


def grpo_job(model, plan, prompts_per_step):
    with tempfile.TemporaryDirectory() as d:
        return nereus.Job(grpo_spec(d, model, prompts_per_step), plan, devices=8, capacity="64MiB")


def index(shard):
    return tuple(slice(lo, hi) for lo, hi in shard.box)


def full_tensors(job, stage, seed):
    """Random full tensors per (tensor, slot), in each slot's dtype, from the unit's boxes."""
    g = torch.Generator().manual_seed(seed)
    full = {}
    for shard in job.units(stage)[0].shards(slot=None):
        key = (shard.tensor, shard.slot)
        if key not in full:
            shape = [0] * len(shard.box)
            for u in job.units(stage):
                for s in u.shards(slot=shard.slot):
                    if s.tensor == shard.tensor:
                        shape = [max(a, hi) for a, (lo, hi) in zip(shape, s.box)]
            full[key] = torch.randn(shape, generator=g).to(TORCH_DTYPE[shard.dtype])
    return full


def write_all(job, stage, full):
    for u in job.units(stage):
        for s in u.shards(slot=None):
            s.data.copy_(full[(s.tensor, s.slot)][index(s)])


def mismatches(job, stage, full):
    bad = []
    for u in job.units(stage):
        for s in u.shards(slot=None):
            want = full[(s.tensor, s.slot)][index(s)]
            got = s.data
            # Bit for bit: compare the raw bytes.
            if not torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                               want.contiguous().view(torch.int16 if want.element_size() == 2 else torch.int32)):
                bad.append(f"{u} {s}")
    return bad


class ZeroCopy(unittest.TestCase):
    def test_views_share_the_units_memory(self):
        job = new_job()
        unit = job.units("actor/train")[0]
        self.assertEqual(unit.devices, [0, 1, 2, 3])
        shards = unit.shards()
        self.assertTrue(shards and all(s.slot == "param" for s in shards))
        buffers = unit.buffers()
        self.assertEqual({(b["device"], b["slot"]) for b in buffers}, {(d, sl) for d in range(4) for sl in SLOTS})
        for s in shards:
            t = s.data
            self.assertEqual(t.data_ptr(), s.data_ptr)
            # The view lies inside one of the unit's buffers on its device, for its slot.
            self.assertTrue(any(b["device"] == s.device and b["slot"] == s.slot and
                                b["data_ptr"] <= t.data_ptr() and
                                t.data_ptr() + t.numel() * t.element_size() <= b["data_ptr"] + b["nbytes"]
                                for b in buffers), s)
            self.assertEqual(tuple(t.shape), s.shape)
            self.assertEqual(t.dtype, torch.bfloat16)
            self.assertEqual(t.numel() * t.element_size(), s.nbytes)
        # Writing through torch is visible through a second view of the same shard.
        shards[0].data.fill_(1.5)
        self.assertTrue(bool((job.units("actor/train")[0].shards()[0].data == 1.5).all()))
        self.assertEqual({s.slot for s in unit.shards(slot=None)}, set(SLOTS))

    def test_round_trip_through_transitions_bit_for_bit(self):
        job = new_job()
        full = full_tensors(job, "actor/train", seed=7)
        write_all(job, "actor/train", full)
        self.assertEqual(mismatches(job, "actor/train", full), [])
        for target in (plan(actor__train="tp=2,pp=1,dp=2,devices=4-7", critic__train="tp=4,pp=1,dp=1,devices=0-3"),
                       BASE,
                       plan(actor__train="tp=2,pp=2,dp=1,devices=4-7", critic__train="tp=4,pp=1,dp=1,devices=0-3")):
            report = job.transition(target)
            self.assertTrue(report["completed"], report)
            self.assertEqual(job.plan["actor/train"], target["actor/train"])
            self.assertEqual(mismatches(job, "actor/train", full), [])


class MixtureOfExperts(unittest.TestCase):
    """A GRPO job on the tiny qwen3_moe: expert-parallel units to TP-split experts and
    back, training state moving with the experts, bit for bit."""
    PLAN = {"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
            "actor/infer": "tp=1,pp=1,ep=2,etp=1,dp=1,devices=0-1",
            "reference/infer": "tp=1,pp=1,ep=2,etp=1,dp=1,devices=2-3",
            "actor/train": "tp=1,pp=2,ep=2,dp=1,devices=0-3"}  # etp = tp = 1: whole experts

    def test_expert_parallel_round_trip(self):
        job = grpo_job("tiny-qwen3-moe", self.PLAN, 8)
        unit = job.units("actor/train")[0]
        self.assertEqual(unit.devices, [0, 1, 2, 3])
        # GPU 1 (stage 0, ep rank 1) holds experts 3-5 of layer 1, whole, and no expert of
        # layer 0 (a dense layer: mlp_only_layers).
        names = {s.tensor for s in unit.shards() if s.device == 1}
        self.assertIn("model.layers.1.mlp.experts.4.up_proj.weight", names)
        self.assertNotIn("model.layers.1.mlp.experts.2.up_proj.weight", names)
        self.assertFalse(any(".layers.0.mlp.experts." in n for n in names))
        full = full_tensors(job, "actor/train", seed=11)
        write_all(job, "actor/train", full)
        for target in ("tp=2,pp=1,dp=2,devices=4-7", "tp=2,pp=1,ep=2,etp=4,dp=1,devices=4-7", self.PLAN["actor/train"]):
            p = dict(self.PLAN)
            p["actor/train"] = target
            report = job.transition(p)
            self.assertTrue(report["completed"], report)
            self.assertEqual(job.plan["actor/train"], target)
            self.assertEqual(mismatches(job, "actor/train", full), [])


class Fsdp(unittest.TestCase):
    """FSDP units (fsdp=F): each device's shards are torch views of dim-0 chunks of the TP
    boxes, cut as torch.chunk cuts them, and training state moves into and out of FSDP
    bit for bit."""

    def test_fsdp_views_and_round_trip(self):
        job = new_job(plan=plan(actor__train="tp=2,pp=1,fsdp=2,dp=1,devices=0-3"))
        unit = job.units("actor/train")[0]
        self.assertEqual(unit.devices, [0, 1, 2, 3])
        full = full_tensors(job, "actor/train", seed=3)
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                     "model.layers.0.input_layernorm.weight"):
            whole = full[(name, "param")]
            for r in range(2):
                # The TP box of rank r (q rows, o columns, the norm whole), then its chunks.
                if "o_proj" in name:
                    tp_box = whole[:, r * whole.shape[1] // 2:(r + 1) * whole.shape[1] // 2]
                elif "q_proj" in name:
                    tp_box = whole[r * whole.shape[0] // 2:(r + 1) * whole.shape[0] // 2]
                else:
                    tp_box = whole
                for f, chunk in enumerate(torch.chunk(tp_box, 2, 0)):
                    device = f * 2 + r  # R[(s·fsdp + f)·tp + r]
                    got = [s for s in unit.shards() if s.tensor == name and s.device == device]
                    self.assertEqual(len(got), 1, (name, device))
                    self.assertEqual(tuple(got[0].data.shape), tuple(chunk.shape), (name, device))
        write_all(job, "actor/train", full)
        self.assertEqual(mismatches(job, "actor/train", full), [])
        for target in ("tp=4,pp=1,dp=1,devices=4-7", "tp=1,pp=1,fsdp=4,dp=1,devices=0-3", "tp=2,pp=2,dp=1,devices=4-7"):
            report = job.transition(plan(actor__train=target, critic__train="tp=4,pp=1,dp=1,devices=0-3")
                                    if target.endswith("4-7") else plan(actor__train=target))
            self.assertTrue(report["completed"], report)
            self.assertEqual(job.plan["actor/train"], target)
            self.assertEqual(mismatches(job, "actor/train", full), [])


class MegatronPacking(unittest.TestCase):
    """A Megatron trainer's own buffers as a unit (packing=megatron): linear_qkv built here
    from Hugging Face q, k, v by Megatron-Core's rule (each query group's q rows, then its
    k and v rows), adopted, and resharded into vLLM's fused layout, compared element by
    element with the Hugging Face tensors."""

    def test_adopted_linear_qkv_reshards_into_fused(self):
        train = "tp=1,pp=1,dp=1,devices=0,packing=megatron"
        p = plan(actor__train=train, actor__generate="tp=2,pp=1,dp=2,devices=0-3,packing=fused")
        probe = new_job(plan=p)
        names = {b["buffer"] for b in probe.units("actor/train")[0].buffers()}
        self.assertIn("decoder.layers.0.self_attention.linear_qkv.weight", names)
        self.assertIn("decoder.layers.0.mlp.linear_fc1.weight", names)
        self.assertIn("embedding.word_embeddings.weight", names)
        q, k, v = (f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkv")
        del probe
        g = torch.Generator().manual_seed(9)
        # Shards of an interleaved tensor are one per query group: the full shape from their boxes.
        hf = {name: torch.randn(shape_of(p, "actor/train", name), generator=g).to(torch.bfloat16) for name in (q, k, v)}
        hd = hf[k].shape[0] // 2  # tiny-llama: 2 kv heads
        nkv, qpg = hf[k].shape[0] // hd, hf[q].shape[0] // hf[k].shape[0]
        groups = [torch.cat([hf[q][j * qpg * hd:(j + 1) * qpg * hd], hf[k][j * hd:(j + 1) * hd], hf[v][j * hd:(j + 1) * hd]])
                  for j in range(nkv)]
        linear_qkv = torch.cat(groups).contiguous()
        # Megatron pads the vocabulary (make_vocab_size_divisible_by): the unit adopts a
        # view of the padded buffer's first rows; the padding stays the trainer's.
        vocab = shape_of(p, "actor/train", "model.embed_tokens.weight")
        padded = torch.randn(vocab[0] + 7, vocab[1], generator=g).to(torch.bfloat16)
        job = new_job(plan=p, adopt=[{"stage": "actor/train", "replica": 0, "device": 0, "slot": "param",
                                      "buffer": "decoder.layers.0.self_attention.linear_qkv.weight", "tensor": linear_qkv},
                                     {"stage": "actor/train", "replica": 0, "device": 0, "slot": "param",
                                      "buffer": "embedding.word_embeddings.weight", "tensor": padded[:vocab[0]]}])
        hf["model.embed_tokens.weight"] = padded[:vocab[0]]
        unit = job.units("actor/train")[0]
        qkv_shards = [s for s in unit.shards() if s.tensor in (q, k, v)]
        self.assertEqual(len(qkv_shards), 3 * nkv)  # a block per tensor and query group
        for s in qkv_shards:
            self.assertTrue(torch.equal(s.data, hf[s.tensor][s.box[0][0]:s.box[0][1]]), (s.tensor, s.box))
        with job.stage("actor/train"):
            pass  # the trainer's step (the weights are already its)
        job.end_step()  # the weight sync: actor/train (Megatron) -> actor/generate (fused)
        for u in job.units("actor/generate"):
            for s in u.shards():
                if s.tensor == "model.embed_tokens.weight":
                    self.assertTrue(torch.equal(s.data, hf[s.tensor][s.box[0][0]:s.box[0][1]]), (s.device, s.box))
            for dev in u.devices:
                parts = sorted((s.data_ptr, s) for s in u.shards() if s.device == dev and s.tensor in (q, k, v))
                # vLLM's qkv_proj: [local q; local k; local v], each equal to the HF rows it names.
                self.assertEqual([s.tensor for _, s in parts], [q, k, v])
                for _, s in parts:
                    self.assertTrue(torch.equal(s.data, hf[s.tensor][s.box[0][0]:s.box[0][1]]), (dev, s.tensor, s.box))
                self.assertEqual(parts[1][0] - parts[0][0], parts[0][1].nbytes)
                self.assertEqual(parts[2][0] - parts[1][0], parts[1][1].nbytes)

    def test_megatron_refusals(self):
        with self.assertRaisesRegex(nereus.Error, "packing=megatron with tp=4 > num_key_value_heads=2"):
            new_job(plan=plan(actor__train="tp=4,pp=1,dp=1,devices=0-3,packing=megatron"))


class DeepSeekStyle(unittest.TestCase):
    """A GRPO job on tiny-deepseek-v3 (MLA, shared experts): the router's float32 bias is a
    float32 view among bf16 ones, and MLA units move bit for bit through TP and EP changes."""
    PLAN = {"actor/generate": "tp=4,pp=1,dp=1,devices=0-3",
            "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
            "reference/infer": "tp=2,pp=1,dp=1,devices=2-3",
            "actor/train": "tp=4,pp=1,dp=1,devices=4-7"}

    def test_mla_units(self):
        job = grpo_job("tiny-deepseek-v3", self.PLAN, 4)
        params = {s.tensor: s.data.dtype for s in job.units("actor/train")[0].shards()}
        self.assertEqual(params["model.layers.1.mlp.gate.e_score_correction_bias"], torch.float32)
        self.assertEqual(params["model.layers.1.self_attn.kv_b_proj.weight"], torch.bfloat16)
        self.assertIn("model.layers.2.mlp.shared_experts.down_proj.weight", params)
        full = full_tensors(job, "actor/train", seed=5)
        write_all(job, "actor/train", full)
        for target in ("tp=1,pp=2,ep=2,etp=1,dp=1,devices=4-7", "tp=2,pp=1,dp=2,devices=4-7"):
            p = dict(self.PLAN)
            p["actor/train"] = target
            report = job.transition(p)
            self.assertTrue(report["completed"], report)
            self.assertEqual(mismatches(job, "actor/train", full), [])


class Fp8Units(unittest.TestCase):
    """A GRPO job whose generation stage holds tiny-deepseek-v3 in FP8 (dtype=fp8): after a
    weight sync its shards, read as uint8 with float32 `weight_scale_inv` beside them,
    dequantize to the trained bf16 weights within FP8's rounding; an FP8 -> FP8
    transition moves bytes and scales bit for bit; a training layout that cuts a block is
    refused when the job is made."""
    PLAN = {"actor/generate": "tp=2,pp=1,dp=2,devices=0-3,dtype=fp8",
            "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
            "reference/infer": "tp=2,pp=1,dp=1,devices=2-3",
            "actor/train": "tp=2,pp=1,dp=2,devices=4-7"}
    BLOCK = (16, 16)  # tiny-deepseek-v3's quantization_config.weight_block_size

    def fp8_state(self, job):
        """{tensor: (box, FP8 bytes, scales)} of every quantized shard of actor/generate."""
        out = {}
        for u in job.units("actor/generate"):
            shards = u.shards()
            scales = {(s.device, s.tensor): s for s in shards if s.tensor.endswith("weight_scale_inv")}
            for s in shards:
                if s.dtype == "f8_e4m3":
                    self.assertEqual(s.data.dtype, torch.uint8)
                    sc = scales[(s.device, s.tensor[:-len("weight")] + "weight_scale_inv")]
                    self.assertEqual(sc.data.dtype, torch.float32)
                    out[(u.replica, s.device, s.tensor)] = (s.box, s.data.clone(), sc.data.clone())
        return out

    def assertSameFp8(self, job, state):
        """Every FP8 shard of actor/generate and its scales as in `state`, bit for bit."""
        now = self.fp8_state(job)
        self.assertEqual(set(now), set(state))
        for k, (box, q, sc) in now.items():
            self.assertTrue(torch.equal(q, state[k][1]) and torch.equal(sc, state[k][2]), k)

    def test_sync_into_fp8_units_and_fp8_transition(self):
        job = grpo_job("tiny-deepseek-v3", self.PLAN, 4)
        full = full_tensors(job, "actor/train", seed=13)
        # Block scales that differ by orders of magnitude: each row band its own range.
        for (name, slot), t in full.items():
            if slot == "param" and t.dim() == 2:
                full[(name, slot)] = (t.float() * torch.logspace(-3, 3, t.shape[0])[:, None]).to(t.dtype)
        write_all(job, "actor/train", full)
        for stage in job.model_stages:
            with job.stage(stage):
                pass
        job.end_step()
        self.assertEqual(job.units("actor/generate")[0].version, 1)
        state = self.fp8_state(job)
        self.assertGreater(len(state), 20)
        worst = 0.0
        for (_, _, name), (box, q, sc) in state.items():
            x = full[(name, "param")][tuple(slice(lo, hi) for lo, hi in box)].double()
            ok, w = within_rounding(dequantize(q, sc, box, self.BLOCK), x, element_scales(sc, box, self.BLOCK))
            self.assertTrue(ok, f"{name} {box}: dequantized within FP8's rounding of the synced bf16 weight")
            worst = max(worst, w)
        self.assertGreater(worst, 0.1)  # rounding happened: the bytes are FP8, not a copy
        # What is not quantized (norms, embedding, router) arrives bf16, bit for bit.
        for u in job.units("actor/generate"):
            for s in u.shards():
                if s.dtype != "f8_e4m3" and not s.tensor.endswith("weight_scale_inv"):
                    self.assertTrue(torch.equal(s.data, full[(s.tensor, "param")][index(s)]), s)
        # FP8 -> FP8: TP 2 to PP 2 for the generation stage; dequantized values unchanged.
        before = {(name, tuple(map(tuple, box))): dequantize(q, sc, box, self.BLOCK)
                  for (_, _, name), (box, q, sc) in state.items()}
        p = dict(self.PLAN)
        p["actor/generate"] = "tp=1,pp=2,dp=2,devices=0-3,dtype=fp8"
        report = job.transition(p)
        self.assertTrue(report["completed"], report)
        after = self.fp8_state(job)
        self.assertTrue(after)
        for (_, _, name), (box, q, sc) in after.items():
            x = full[(name, "param")][tuple(slice(lo, hi) for lo, hi in box)].double()
            deq = dequantize(q, sc, box, self.BLOCK)
            for (n0, b0), d0 in before.items():  # every earlier shard overlapping this one agrees exactly
                if n0 != name:
                    continue
                lo = [max(a[0], b[0]) for a, b in zip(box, b0)]
                hi = [min(a[1], b[1]) for a, b in zip(box, b0)]
                if all(l < h for l, h in zip(lo, hi)):
                    mine = deq[lo[0] - box[0][0]:hi[0] - box[0][0], lo[1] - box[1][0]:hi[1] - box[1][0]]
                    theirs = d0[lo[0] - b0[0][0]:hi[0] - b0[0][0], lo[1] - b0[1][0]:hi[1] - b0[1][0]]
                    self.assertTrue(torch.equal(mine.nan_to_num(), theirs.nan_to_num()), f"{name} {box}")
            self.assertTrue(within_rounding(deq, x, element_scales(sc, box, self.BLOCK))[0], name)

    def test_weights_and_checkpoints_of_fp8_units(self):
        with tempfile.TemporaryDirectory() as d:
            spec = grpo_spec(d, "tiny-deepseek-v3", 4)
            job = nereus.Job(spec, self.PLAN, devices=8, capacity="64MiB")
            shapes = {}
            for u in job.units("actor/train"):
                for s in u.shards():
                    shapes[s.tensor] = [max(a, hi) for a, (lo, hi) in zip(shapes.get(s.tensor, [0] * len(s.box)), s.box)]
            g = torch.Generator().manual_seed(17)
            weights = {}
            for n, shape in shapes.items():
                t = torch.randn(shape, generator=g)
                if len(shape) == 2:
                    t = t * torch.logspace(-2, 2, shape[0])[:, None]
                weights[n] = t.to(torch.bfloat16).float()
            write_safetensors(os.path.join(d, "model.safetensors"), weights)
            # float32 weights into every actor stage: the FP8 one quantizes them as it reads.
            job.load_weights("actor", os.path.join(d, "model.safetensors"))
            state = self.fp8_state(job)
            self.assertGreater(len(state), 20)
            for (_, _, name), (box, q, sc) in state.items():
                x = weights[name][tuple(slice(lo, hi) for lo, hi in box)].double()
                self.assertTrue(within_rounding(dequantize(q, sc, box, self.BLOCK), x, element_scales(sc, box, self.BLOCK))[0], name)
            # The same bytes a weight sync writes from those weights.
            synced = nereus.Job(spec, self.PLAN, devices=8, capacity="64MiB")
            for u in synced.units("actor/train"):
                for s in u.shards():
                    s.data.copy_(weights[s.tensor][index(s)])
            for stage in synced.model_stages:
                with synced.stage(stage):
                    pass
            synced.end_step()
            self.assertSameFp8(synced, state)
            # save_weights writes the FP8 stage as its checkpoint ships: F8_E4M3 and weight_scale_inv.
            out = os.path.join(d, "fp8.safetensors")
            job.save_weights("actor/generate", out)
            back = read_safetensors(out)
            for name in {n for (_, _, n) in state}:
                self.assertEqual(back[name].dtype, torch.uint8)
                scale = back[name[:-len("weight")] + "weight_scale_inv"]
                self.assertEqual(scale.dtype, torch.float32)
                self.assertEqual(list(scale.shape), [-(-s // b) for s, b in zip(shapes[name], self.BLOCK)])
                full = [(0, shapes[name][0]), (0, shapes[name][1])]
                deq = dequantize(back[name], scale, full, self.BLOCK)
                self.assertTrue(within_rounding(deq, weights[name].double(), element_scales(scale, full, self.BLOCK))[0], name)
            # ... which an FP8 stage loads as it is, bit for bit, and a bf16 one refuses.
            again = nereus.Job(spec, self.PLAN, devices=8, capacity="64MiB")
            again.load_weights("actor/generate", out)
            self.assertSameFp8(again, state)
            with self.assertRaisesRegex(nereus.Error, "block-scaled FP8 .* only dtype=fp8 units"):
                again.load_weights("actor", out)
            # A checkpoint of the job resumes its FP8 units exactly.
            job.save_checkpoint(os.path.join(d, "ckpt"))
            resumed = nereus.Job.resume(os.path.join(d, "ckpt"), spec, devices=8, capacity="64MiB")
            self.assertSameFp8(resumed, state)

    def test_a_sync_of_the_fill_holds_the_fill_quantized(self):
        with tempfile.TemporaryDirectory() as d:
            job = nereus.Job(grpo_spec(d, "tiny-deepseek-v3", 4), self.PLAN, devices=8, capacity="64MiB", fill=True)
        for u in job.units("actor/generate"):  # what the sync must write back
            for s in u.shards():
                s.data.zero_()
        self.assertFalse(job.verify()["ok"])
        for stage in job.model_stages:
            with job.stage(stage):
                pass
        job.end_step()
        self.assertEqual(job.units("actor/generate")[0].version, 1)
        check = job.verify()  # sharding.md's fill of every unit; FP8 ones: the fill quantized
        self.assertTrue(check["ok"], check["first_error"])

    def test_a_training_layout_that_cuts_a_block_is_refused(self):
        p = dict(self.PLAN)
        p["actor/train"] = "tp=4,pp=1,dp=1,devices=4-7"  # shared experts' 32 rows cut at 8
        with self.assertRaisesRegex(nereus.Error, "actor/train', whose weight sync feeds FP8 'actor/generate'.*block"):
            grpo_job("tiny-deepseek-v3", p, 4)


class FrameworkMemory(unittest.TestCase):
    def test_adopted_tensors_are_the_units(self):
        probe = new_job()
        owned, adopt = [], []
        for u in probe.units("actor/train"):
            for s in u.shards():
                t = torch.zeros(s.shape, dtype=TORCH_DTYPE[s.dtype])
                owned.append(t)
                adopt.append({"stage": "actor/train", "replica": u.replica, "device": s.device,
                              "buffer": s.tensor, "slot": "param", "tensor": t})
        del probe
        job = new_job(adopt=adopt)
        shards = job.units("actor/train")[0].shards()
        self.assertEqual([s.data_ptr for s in shards], [t.data_ptr() for t in owned])
        for t in owned:  # the framework writes its own tensors
            t.copy_(torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape).remainder(251).to(t.dtype))
        report = job.transition(plan(actor__train="tp=2,pp=1,dp=2,devices=4-7",
                                     critic__train="tp=4,pp=1,dp=1,devices=0-3"))
        self.assertTrue(report["completed"])
        by_name = {}
        for s, t in zip(shards, owned):
            by_name.setdefault(s.tensor, []).append((s.box, t))
        for u in job.units("actor/train"):
            for s in u.shards():
                # Each new shard equals the framework's tensor over the same box.
                for box, t in by_name[s.tensor]:
                    if all(lo <= a and b <= hi for (lo, hi), (a, b) in zip(box, s.box)):
                        rel = tuple(slice(a - lo, b - lo) for (lo, _), (a, b) in zip(box, s.box))
                        self.assertTrue(torch.equal(s.data, t[rel]))
                        break
                else:
                    # A box spanning several adopted shards: compare piece by piece.
                    for box, t in by_name[s.tensor]:
                        inter = [(max(lo, a), min(hi, b)) for (lo, hi), (a, b) in zip(box, s.box)]
                        if all(lo < hi for lo, hi in inter):
                            mine = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, s.box))
                            theirs = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, box))
                            self.assertTrue(torch.equal(s.data[mine], t[theirs]))

    def test_bad_adoption_is_an_error(self):
        t = torch.zeros(4, dtype=torch.bfloat16)
        with self.assertRaisesRegex(nereus.Error, "no buffer 'model.nope@param'"):
            new_job(adopt=[{"stage": "actor/train", "device": 0, "buffer": "model.nope", "tensor": t}])
        with self.assertRaisesRegex(nereus.Error, "but the buffer needs"):
            new_job(adopt=[{"stage": "actor/train", "device": 0, "buffer": "model.embed_tokens.weight", "tensor": t}])
        with self.assertRaisesRegex(nereus.Error, "not contiguous"):
            new_job(adopt=[{"stage": "actor/train", "device": 0, "buffer": "model.embed_tokens.weight",
                            "tensor": torch.zeros(4, 4).t()}])


class BadInput(unittest.TestCase):
    def test_gpu_memory_without_a_gpu_is_one_error(self):
        if torch.cuda.is_available():
            self.skipTest("a GPU is here: the GPU suite runs jobs in GPU memory")
        with self.assertRaisesRegex(nereus.Error, "device 0: no CUDA device 0|device 0: no cuda backend"):
            new_job(memory="cuda")
        with self.assertRaisesRegex(nereus.Error, "memory must be 'host' or 'cuda', not 'tpu'"):
            new_job(memory="tpu")
        # A framework's tensors must be where the units are: CPU tensors on host devices.
        self.assertEqual(new_job(fill=True).units("actor/train")[0].shards()[0].__dlpack_device__(), (1, 0))

    def test_errors_leave_the_job_usable(self):
        job = new_job(fill=True, capacity="16MiB")  # actor/train (19 MB) fits only when split
        with self.assertRaisesRegex(nereus.Error, "unknown slot 'moment'"):
            job.units("actor/train")[0].shards(slot="moment")
        with self.assertRaisesRegex(nereus.Error, "not a model-stage"):
            job.units("actor/nothing")
        with self.assertRaisesRegex(nereus.Error, "not a model-stage"):
            job.stage("critic/generate").__enter__()
        with self.assertRaisesRegex(nereus.Error, "tp"):
            job.transition(plan(actor__train="tp=3,pp=1,dp=1,devices=0-2"))
        with self.assertRaisesRegex(nereus.Error, "infeasible"):
            job.transition(plan(actor__train="tp=1,pp=1,dp=1,devices=0"))
        handle = job.begin_transition(plan(critic__train="tp=2,pp=2,dp=1,devices=4-7"))
        with self.assertRaisesRegex(nereus.Error, "already in flight"):
            job.begin_transition(BASE)
        self.assertTrue(handle.wait()["completed"])
        self.assertTrue(job.verify()["ok"])
        self.assertTrue(job.transition(BASE)["completed"])  # still usable
        self.assertTrue(job.verify()["ok"])
        with self.assertRaises(TypeError):
            job.transition(42)
        # A framework stream: named per GPU, or by an object that says its GPU; on host
        # memory the work is done when its calls return, so nothing is held.
        with self.assertRaisesRegex(nereus.Error, "does not say its GPU"):
            job.stage("critic/infer", stream=7).__enter__()
        with self.assertRaisesRegex(nereus.Error, "int handle"):
            job.end_step(stream={0: "the default"})

        class Stream:
            device_index, cuda_stream = 0, 0x1234
        with job.stage("critic/infer", stream=Stream()):
            pass
        with job.stage("reward/infer", stream={0: 0x1234, 1: Stream()}):
            pass
        self.assertTrue(all(d["used"] <= d["budget"] for d in job.devices()))
        job.end_step(stream=[Stream()])
        # Cancelled at once: every model-stage keeps a complete collection, old or new.
        handle = job.begin_transition(plan(actor__train="tp=2,pp=1,dp=2,devices=4-7",
                                           critic__train="tp=4,pp=1,dp=1,devices=0-3"))
        handle.cancel()
        report = handle.wait()
        self.assertTrue(report["cancelled"] or report["completed"], report)
        self.assertTrue(handle.done)
        self.assertTrue(job.verify()["ok"])
        self.assertTrue(job.transition(BASE)["completed"])


class NeverStall(unittest.TestCase):
    def test_a_busy_python_stage_does_not_hold_up_a_transition(self):
        job = new_job(fill=True)
        entered, finished = threading.Event(), {}

        def busy():
            with job.stage("critic/infer"):  # devices 2-3
                entered.set()
                end = time.monotonic() + 3.0
                x = 0
                while time.monotonic() < end:  # pure Python: holds the GIL but for switches
                    x += sum(range(200))
            finished["stage"] = time.monotonic()

        worker = threading.Thread(target=busy)
        worker.start()
        self.assertTrue(entered.wait(30))
        # reference/infer (devices 0-1) changes layout while the stage computes.
        report = job.begin_transition(plan(reference__infer="tp=1,pp=1,dp=2,devices=0-1")).wait()
        finished["transition"] = time.monotonic()
        worker.join()
        self.assertTrue(report["completed"], report)
        self.assertLess(finished["transition"], finished["stage"])
        job.end_step()
        self.assertTrue(job.verify()["ok"])

    def test_await_under_asyncio(self):
        job = new_job(fill=True)

        async def main():
            return await job.begin_transition(plan(critic__train="tp=2,pp=2,dp=1,devices=4-7"))

        report = asyncio.run(main())
        self.assertTrue(report["completed"])
        self.assertEqual(job.plan["critic/train"], "tp=2,pp=2,dp=1,devices=4-7")


ASYNC_PLAN = {"actor/generate": "tp=1,pp=1,dp=2,devices=0-1", "actor/infer": "tp=2,pp=1,dp=1,devices=2-3",
              "reference/infer": "tp=2,pp=1,dp=1,devices=2-3", "actor/train": "tp=2,pp=1,dp=1,devices=4-5"}


def async_job(d, plan=None, **extra):
    path = os.path.join(d, "async.json")
    with open(path, "w") as f:
        json.dump({"algorithm": "grpo", "prompts_per_step": 8, "samples_per_prompt": 2, "prompt_len": 8,
                   "max_response_len": 16, "models": {"actor": "tiny-llama", "reference": "tiny-llama", "reward": "rule"},
                   "mode": "async", **extra}, f)
    return nereus.Job(path, plan or ASYNC_PLAN, devices=6, capacity="64MiB")


class AsyncUpdates(unittest.TestCase):
    """Engine-shaped weight updates: begin, metadata, wait, finish(pause) while a generation
    thread keeps decoding and reads its units at every step."""

    def test_update_in_flight_while_generation_decodes(self):
        with tempfile.TemporaryDirectory() as d:
            job = async_job(d)
        self.assertEqual((job.mode, job.max_staleness), ("async", 1))
        with self.assertRaisesRegex(nereus.Error, "already holds version 0"):
            job.begin_weight_update("actor/generate")
        versions = [full_tensors(job, "actor/train", seed) for seed in (1, 2)]
        write_all(job, "actor/generate", versions[0])
        with job.stage("actor/train"):
            write_all(job, "actor/train", versions[1])
        update = job.begin_weight_update("actor/generate")
        self.assertEqual(update.version, 1)
        meta = update.metadata()
        self.assertEqual(sorted(meta), [0, 1])
        names = {e["name"] for e in meta[0]}
        self.assertIn("model.layers.0.self_attn.q_proj.weight", names)
        self.assertTrue(all(e["dtype"] == "bf16" and e["slot"] == "param" for e in meta[0]))
        seen, out = [], {}

        def generation():
            with job.stage("actor/generate") as held:
                for step in range(200):
                    units = job.units("actor/generate")
                    for u in units:  # every unit holds one whole version
                        gen_full = {k: v for k, v in versions[u.version].items() if k[1] == "param"}
                        bad = [s for s in u.shards() if not torch.equal(s.data, gen_full[(s.tensor, "param")][index(s)])]
                        seen.append((u.version, len(bad)))
                    if update.ready and "report" not in out:
                        out["report"] = update.finish("keep")
                        try:
                            held[0].shards()[0].data  # the run's first views show the old weights: freed
                        except nereus.Error as e:
                            out["expired"] = str(e)
                    if "report" in out and step > 5:
                        break
                    time.sleep(0.002)

        worker = threading.Thread(target=generation)
        worker.start()
        worker.join()
        r = out["report"]
        self.assertTrue(r["completed"], r)
        self.assertEqual((r["weight_version"], r["pause"], r["unit_versions"]), (1, "keep", [1, 1]))
        self.assertGreater(r["moved_bytes"], 0)
        self.assertLessEqual(r["paused_seconds"], 0.1 * r["seconds"])
        self.assertIn("weight update freed this memory", out.get("expired", ""))
        self.assertEqual([b for _, b in seen if b], [])
        self.assertEqual({v for v, _ in seen}, {0, 1})
        self.assertEqual(mismatches(job, "actor/generate", {k: v for k, v in versions[1].items() if k[1] == "param"}), [])

    def test_metadata_names_the_engine_layout(self):
        """Under packing=fused the metadata is vLLM's fused buffers, with their local shapes."""
        with tempfile.TemporaryDirectory() as d:
            job = async_job(d, dict(ASYNC_PLAN, **{"actor/generate": "tp=2,pp=1,dp=1,devices=0-1,packing=fused"}))
        with job.stage("actor/train"):
            pass
        update = job.begin_weight_update("actor/generate")
        meta = update.metadata()
        by_name = {e["name"]: e for e in meta[1]}
        units = job.units("actor/generate")
        buffers = {b["buffer"]: b for b in units[0].buffers() if b["device"] == 1}
        self.assertEqual(set(by_name), set(buffers))
        qkv = by_name["model.layers.0.self_attn.qkv_proj.weight"]
        self.assertEqual(qkv["shape"][0] * qkv["shape"][1] * 2, buffers["model.layers.0.self_attn.qkv_proj.weight"]["nbytes"])
        self.assertIn("model.layers.0.mlp.gate_up_proj.weight", by_name)
        self.assertEqual(update.finish("wait")["unit_versions"], [1])

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as d:
            job = async_job(d)
            with self.assertRaisesRegex(nereus.Error, "share device 4"):
                nereus.Job(os.path.join(d, "async.json"), dict(ASYNC_PLAN, **{"actor/generate": "tp=1,pp=1,dp=2,devices=4-5"}),
                           devices=6, capacity="64MiB")
            with self.assertRaisesRegex(nereus.Error, "max_staleness' is 0"):
                async_job(d, max_staleness=0)
        with job.stage("actor/train"):
            pass
        update = job.begin_weight_update("actor/generate")
        with self.assertRaisesRegex(nereus.Error, "pause mode 'later'"):
            update.finish("later")
        update.cancel()
        with self.assertRaisesRegex(nereus.Error, "cancelled"):
            update.finish("keep")
        self.assertEqual([u.version for u in job.units("actor/generate")], [0, 0])
        with self.assertRaisesRegex(nereus.Error, "not async"):
            new_job().begin_weight_update("actor/generate")

    def test_the_live_controller_and_plan_changes_between_steps(self):
        """report_step decides on the async model (generation apart); a plan change runs with
        both streams idle and leaves every generation unit on the trainer's whole version."""
        with tempfile.TemporaryDirectory() as d:
            job = async_job(d)
        versions = [full_tensors(job, "actor/train", seed) for seed in (1, 2)]
        write_all(job, "actor/generate", versions[0])
        with job.stage("actor/generate"):
            pass
        with job.stage("actor/train"):
            write_all(job, "actor/train", versions[1])
        with self.assertRaisesRegex(nereus.Error, "ran in this step; an async job changes plan between training steps"):
            job.begin_transition(dict(ASYNC_PLAN, **{"actor/generate": "tp=2,pp=1,dp=1,devices=0-1"}))
        job.end_step()
        peak = max(x["used"] for x in job.devices())
        decision = job.report_step({s: 0.5 for s in job.model_stages}, 8, 8, peak_bytes=peak)
        self.assertIn("trigger", decision)
        if decision["admitted"]:  # what it proposes, the async job can run: generation apart
            self.assertTrue(job.transition(decision["target"])["completed"], decision)
        target = dict(ASYNC_PLAN, **{"actor/generate": "tp=2,pp=1,dp=1,devices=0-1", "actor/train": "tp=1,pp=1,dp=2,devices=4-5"})
        with self.assertRaisesRegex(nereus.Error, "share device 4"):
            job.begin_transition(dict(target, **{"actor/generate": "tp=2,pp=1,dp=1,devices=4-5"}))
        report = job.transition(target)
        self.assertTrue(report["completed"], report)
        self.assertEqual([u.version for u in job.units("actor/generate")], [1])
        self.assertEqual(mismatches(job, "actor/generate", {k: v for k, v in versions[1].items() if k[1] == "param"}), [])


class Workspace(unittest.TestCase):
    def test_a_stage_workspace_is_memory_of_its_devices_while_it_runs(self):
        job = new_job()
        used = {d["device"]: d["used"] for d in job.devices()}
        job.set_workspace("actor/generate", 1 << 20)
        with job.stage("actor/generate") as units:
            ws = units[0].workspace(units[0].devices[0])
            self.assertEqual(ws.nbytes, 1 << 20)
            data = ws.data
            self.assertEqual((data.dtype, data.numel()), (torch.uint8, 1 << 20))
            data.view(torch.bfloat16).fill_(1.5)  # a KV cache, say
            self.assertEqual(ws.data.view(torch.bfloat16)[-1].item(), 1.5)
            during = {d["device"]: d for d in job.devices()}
            for u in units:
                for dev in u.devices:
                    self.assertEqual(during[dev]["used"], used[dev] + (1 << 20))
                    self.assertEqual(during[dev]["step_peak"], used[dev] + (1 << 20))
            with self.assertRaisesRegex(nereus.Error, "no workspace on device 7"):
                units[0].workspace(7)
        self.assertEqual({d["device"]: d["used"] for d in job.devices()}, used)
        self.assertGreater(max(d["step_peak"] for d in job.devices()), 0)
        for stage in job.model_stages:
            if stage != "actor/generate":
                with job.stage(stage):
                    pass
        job.end_step()
        self.assertEqual(max(d["step_peak"] for d in job.devices()), 0)

    def test_a_workspace_over_capacity_is_an_error_and_the_stage_stays_usable(self):
        job = new_job()
        job.set_workspace("actor/generate", 1 << 30)
        with self.assertRaisesRegex(nereus.Error, "actor/generate workspace"):
            with job.stage("actor/generate"):
                pass
        job.set_workspace("actor/generate", 0)
        with job.stage("actor/generate") as units:
            self.assertEqual(len(units), 2)
        with self.assertRaisesRegex(nereus.Error, "not a model-stage"):
            job.set_workspace("actor/nothing", 1)


class Controller(unittest.TestCase):
    def test_memory_the_next_step_would_need_makes_an_urgent_change(self):
        # The measured peak calibrates the memory estimate; responses so long that the
        # current plan would not fit force a change even where time gains never pay back.
        job = new_job(capacity="24MiB", gamma=1e-4)
        peak = max(d["used"] for d in job.devices())
        times = {s: 0.5 for s in job.model_stages}
        d = job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=8, next_response_len_p95=8)
        self.assertIn(d["trigger"], ("", "model"))  # no drift; the calibrated model may rank another plan ahead
        d = job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=512, next_response_len_p95=512)
        self.assertIn("length", d["trigger"])
        self.assertFalse(d["urgent"])
        if d["admitted"]:  # only what pays back even at γ = 1e-4 (a DP change with almost nothing to move)
            self.assertLessEqual(d["transition_seconds"], 1e-4 * d["horizon_steps"] * d["delta_seconds"] * (1 + 1e-9), d["why"])
        job = new_job(capacity="24MiB", gamma=1e-4)
        job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=8, next_response_len_p95=8)
        d = job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=2048, next_response_len_p95=2048)
        self.assertIn("memory", d["trigger"])
        self.assertTrue(d["urgent"] and d["admitted"], d["why"])
        self.assertTrue(job.transition(d["target"])["completed"])
        # Far longer still, no plan runs the next step: the job stops here with the reason
        # (the step, the GPU, the model-stage, the shortfall), not in a stage that overflows.
        job = new_job(capacity="24MiB", gamma=1e-4)
        job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=8, next_response_len_p95=8)
        with self.assertRaisesRegex(nereus.Error, r"controller: step \d+ cannot run on the current plan: GPU \d+ needs "
                                                  r".* with \w+/\w+'s working memory, over its budget of .* short\)"):
            job.report_step(times, 8, 8, peak_bytes=peak, next_response_len_mean=1 << 20, next_response_len_p95=1 << 20)

    def test_a_view_kept_past_its_unit_raises(self):
        job = new_job()
        unit = job.units("actor/train")[0]
        shard = unit.shards()[0]
        for s in unit.shards():
            s.data.fill_(1.0)  # usable while the unit exists
        self.assertTrue(job.transition(plan(**{"actor/train": "tp=2,pp=1,dp=2,devices=4-7",
                                                "critic/train": "tp=4,pp=1,dp=1,devices=0-3"}))["completed"])
        with self.assertRaisesRegex(nereus.Error, r"actor/train unit 0: a transition or weight update freed this memory; take new views"):
            shard.data
        with self.assertRaisesRegex(nereus.Error, "a transition or weight update freed this memory"):
            shard.data_ptr
        with self.assertRaisesRegex(nereus.Error, "a transition or weight update freed this memory"):
            unit.buffers()
        # New views work, and units that stayed keep their views.
        self.assertTrue(all(bool((s.data == 1.0).all()) for u in job.units("actor/train") for s in u.shards()))
        kept = job.units("reference/infer")[0].shards()[0]
        job.end_step()
        kept.data.zero_()


    def test_report_step_returns_the_decision_with_its_numbers(self):
        job = new_job()
        for stage in job.model_stages:
            with job.stage(stage):
                pass
        job.end_step()
        times = {s: 0.5 for s in job.model_stages}
        d = job.report_step(stage_seconds=times, response_len_mean=100, response_len_p95=150)
        for key in ("trigger", "delta_seconds", "transition_seconds", "charged_seconds", "horizon_steps", "gamma",
                    "admitted", "why", "target"):
            self.assertIn(key, d)
        self.assertEqual(d["step"], 1)
        # The embedded controller does not count on the transition hiding: it charges all of L_tran.
        self.assertEqual(d["charged_seconds"], d["transition_seconds"])
        # Responses 8x longer: a drift the controller replans for.
        d = job.report_step(stage_seconds=times, response_len_mean=800, response_len_p95=1200)
        self.assertIn("length", d["trigger"])
        self.assertTrue(d["replanned"])
        if d["admitted"]:
            self.assertTrue(job.transition(d["target"])["completed"])
        with self.assertRaisesRegex(nereus.Error, "not a model-stage"):
            job.report_step(stage_seconds={"actor/nothing": 1.0}, response_len_mean=1, response_len_p95=1)


def write_safetensors(path, tensors):
    """A safetensors file written here, independently of Nereus: name -> float32 tensor."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        dtype = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "F8_E4M3": torch.uint8}[e["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[lo:hi]), dtype=dtype).reshape(e["shape"])
    return out


class Weights(unittest.TestCase):
    def test_load_save_and_resume(self):
        job = new_job()
        names = {s.tensor: s for s in job.units("actor/train")[0].shards()}
        shapes = {}
        for u in job.units("actor/train"):
            for s in u.shards():
                shapes[s.tensor] = [max(a, hi) for a, (lo, hi) in zip(shapes.get(s.tensor, [0] * len(s.box)), s.box)]
        g = torch.Generator().manual_seed(3)
        weights = {n: torch.randn(shape, generator=g).to(torch.bfloat16).float() for n, shape in shapes.items()}
        with tempfile.TemporaryDirectory() as d:
            write_safetensors(os.path.join(d, "model.safetensors"), weights)
            job.load_weights("actor", os.path.join(d, "model.safetensors"))
            for stage in ("actor/train", "actor/generate"):
                for u in job.units(stage):
                    for s in u.shards():
                        self.assertTrue(torch.equal(s.data.float(), weights[s.tensor][index(s)]), f"{stage} {s}")
            job.save_weights("actor/train", os.path.join(d, "out.safetensors"))
            back = read_safetensors(os.path.join(d, "out.safetensors"))
            self.assertEqual(set(back), set(names))
            for n, t in back.items():
                self.assertEqual(t.dtype, torch.bfloat16)
                self.assertTrue(torch.equal(t.float(), weights[n]))
            with self.assertRaisesRegex(nereus.Error, "lacks tensor"):
                write_safetensors(os.path.join(d, "short.safetensors"), {"model.norm.weight": weights["model.norm.weight"]})
                job.load_weights("actor", os.path.join(d, "short.safetensors"))

            # Checkpoint after a step, resume, and compare every slot.
            full = full_tensors(job, "actor/train", seed=11)
            write_all(job, "actor/train", full)
            for stage in job.model_stages:
                with job.stage(stage):
                    pass
            job.end_step()
            job.save_checkpoint(os.path.join(d, "ckpt"))
            again = nereus.Job.resume(os.path.join(d, "ckpt"), JOB, devices=8, capacity="64MiB")
            self.assertEqual(again.plan, job.plan)
            self.assertEqual(again.step, job.step)
            for stage in job.model_stages:
                self.assertEqual(again.state(stage), job.state(stage))
            self.assertEqual(mismatches(again, "actor/train", full), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
