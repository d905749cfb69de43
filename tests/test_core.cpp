// Core value types: model configs, tensor lists, layouts, boxes, the fill.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "nereus/core/cluster.hpp"
#include "nereus/core/emu.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/trace_events.hpp"
#include "nereus/core/fill.hpp"
#include "nereus/core/job.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/core/presets.hpp"
#include "nereus/core/sharding.hpp"
#include "cases.hpp"
#include "reference.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {
}  // namespace

TEST_CASE("presets parse and give the published parameter counts") {
  CHECK(load_model("llama-3.1-8b")->parameters() == 8030261248);
  CHECK(load_model("llama-3.2-1b")->parameters() == 1235814400);
  CHECK(load_model("qwen2.5-0.5b")->parameters() == 494032768);
  CHECK(load_model("qwen2.5-7b")->parameters() == 7615616512);
  CHECK(load_model("qwen3-8b")->parameters() == 8190735360);
  for (const auto& name : preset_names(PresetKind::model)) CHECK_NOTHROW(load_model(name));
  for (const auto& name : preset_names(PresetKind::cluster)) CHECK_NOTHROW(load_cluster(name));
}

TEST_CASE("presets are copies of the design folder's files (an optional check, when NEREUS_SHARED names it)") {
  // The product carries its own copy of every preset it offers; the project's design
  // folder (../shared beside a developer's clone) may hold more (models whose support is
  // still to come). A clone alone has none: the check says it did not run.
  const char* shared = std::getenv("NEREUS_SHARED");
  if (!shared || !std::filesystem::is_directory(std::string(shared) + "/models")) {
    MESSAGE("optional check not run: no design folder at NEREUS_SHARED (" << std::string(shared ? shared : "unset") << ")");
    return;
  }
  for (const auto& [kind, folder] : {std::pair{PresetKind::model, "models"}, std::pair{PresetKind::cluster, "clusters"},
                                     std::pair{PresetKind::job, "jobs"}}) {
    int seen = 0;
    for (const auto& name : preset_names(kind)) {
      const std::string path = std::string(shared) + "/" + folder + "/" + name + ".json";
      if (!std::filesystem::exists(path)) continue;
      CHECK_MESSAGE(std::string(*find_preset(kind, name)) == read_text_file(path), "preset ", name, " differs from ", path);
      ++seen;
    }
    CHECK(seen > 0);
  }
}

TEST_CASE("tensor lists match the independent reading of sharding.md") {
  std::vector<std::string> names = preset_names(PresetKind::model);
  names.push_back("tiny-mla-odd");  // MLA without q compression, uneven experts (tests/cases.hpp)
  for (const auto& name : names) {
    CAPTURE(name);
    const auto m = testcase::model(name);
    const auto want = ref::tensors(m->config());
    // The full-size DeepSeek-V3 and Kimi-K2 (45,395 and 69,975 tensors): their lists; their
    // shards follow the same rules as the tiny MLA models' checked below.
    const bool shards = m->tensors().size() < 5000;
    REQUIRE(want.size() == m->tensors().size());
    for (const auto& t : want) {
      const auto id = m->find(t.name);
      REQUIRE_MESSAGE(id.has_value(), t.name);
      const TensorInfo& info = m->tensor(*id);
      CHECK(info.rank == static_cast<int>(t.shape.size()));
      for (int d = 0; d < info.rank; ++d) CHECK(info.shape[d] == t.shape[d]);
      if (info.layer >= 0) CHECK(m->find(info.kind, info.layer, std::max(info.expert, 0)) == id);
      CHECK(info.expert == t.expert);
      CHECK(info.dtype == (t.f32 ? DType::f32 : m->config().dtype));
      if (!shards) continue;
      std::vector<Layout> layouts{Layout{1, 1, {}, Packing::hf}, Layout{2, 2, {}, Packing::hf}, Layout{4, 3, {}, Packing::hf}};
      if (m->config().moe())  // expert parallelism: whole experts, and experts split 2 ways across ep ranks
        layouts.insert(layouts.end(), {Layout{1, 2, {}, Packing::hf, 4, 1}, Layout{2, 1, {}, Packing::hf, 2, 4},
                                       Layout{2, 3, {}, Packing::hf, 3, 0}});
      for (const Layout& l : layouts) {
        if (m->config().heads % l.tp || (m->config().kv_heads % l.tp && l.tp % m->config().kv_heads)) continue;
        if (l.expert_groups() > m->config().experts && m->config().moe()) continue;
        for (int s = 0; s < l.pp; ++s)
          for (int r = 0; r < l.stage_size(); ++r) {
            const auto got = shard_box(m->config(), l, s, r, info);
            const auto want = ref::shard(m->config(), t, ref::Layout{l.tp, l.pp, {}, false, l.ep, l.etp}, s, r);
            REQUIRE(got.has_value() == want.has_value());
            if (got)
              for (int d = 0; d < got->rank; ++d) CHECK((got->dims[d].lo == (*want)[d].first && got->dims[d].hi == (*want)[d].second));
          }
      }
    }
  }
  const auto q3 = load_model("qwen3-8b");
  CHECK(q3->find("model.layers.0.self_attn.q_norm.weight").has_value());
  CHECK_FALSE(q3->find("model.layers.0.self_attn.q_proj.bias").has_value());
  CHECK(load_model("qwen2.5-7b")->find("model.layers.27.self_attn.v_proj.bias").has_value());
  CHECK_FALSE(load_model("llama-3.2-1b")->find("lm_head.weight").has_value());
}

TEST_CASE("config errors name the field") {
  auto parse = [](const std::string& j) { return error_of([&] { parse_model_config(j, "cfg.json"); }); };
  const std::string base = R"("hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50,"torch_dtype":"bfloat16")";
  CHECK(parse(R"({"model_type":"llama",)" + base + "}").empty());
  CHECK(has(parse("{" + base + "}"), "model_type"));
  CHECK(has(parse(R"({"model_type":"gpt2",)" + base + "}"), "unknown architecture 'gpt2'"));
  CHECK(has(parse(R"({"architectures":["MistralForCausalLM"],)" + base + "}"), "MistralForCausalLM"));
  CHECK(has(parse(R"({"model_type":"llama","hidden_size":64})"), "intermediate_size"));
  CHECK(has(parse(R"({"model_type":"llama",)" + base + R"(,"num_key_value_heads":"two"})"), "num_key_value_heads"));
  CHECK(has(parse(R"({"model_type":"llama","hidden_size":64.5,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50,"torch_dtype":"bfloat16"})"), "'hidden_size' must be an integer"));
  CHECK(has(parse(R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50})"), "torch_dtype"));
  CHECK(has(parse(R"({"model_type":"llama",)" + base + R"(,"num_key_value_heads":3})"), "num_key_value_heads 3"));
  CHECK(has(parse("{nope"), "not valid JSON"));
  CHECK(has(parse(R"({"model_type":"llama",)" + base + R"(,"tie_word_embeddings":"yes"})"), "tie_word_embeddings"));
  CHECK(has(error_of([] { load_model("no-such-model"); }), "neither a file nor a preset"));
}

TEST_CASE("score heads: value and reward models hold score.weight [num_labels, H], replicated, last stage") {
  const auto v = load_model("tiny-llama-value");
  CHECK(v->config().score_labels == 1);
  CHECK_FALSE(v->find("lm_head.weight").has_value());
  const auto id = v->find("score.weight");
  REQUIRE(id.has_value());
  CHECK(v->find(TensorKind::score) == id);
  CHECK_FALSE(v->find(TensorKind::lm_head).has_value());
  const TensorInfo& score = v->tensor(*id);
  CHECK((score.shape[0] == 1 && score.shape[1] == 128));
  CHECK(v->parameters() == load_model("tiny-llama")->parameters() - 1003 * 128 + 128);
  const Layout l{2, 3, {}, Packing::hf};
  for (int r = 0; r < 2; ++r) {
    CHECK_FALSE(shard_box(v->config(), l, 0, r, score).has_value());
    const auto b = shard_box(v->config(), l, 2, r, score);
    REQUIRE(b.has_value());
    CHECK((b->dims[0] == Range{0, 1} && b->dims[1] == Range{0, 128}));  // every rank holds all of it
  }
  CHECK(load_model("llama-3.1-8b-score")->config().score_labels == 1);
  CHECK(load_model("qwen2.5-7b-score")->find("score.weight").has_value());
  CHECK(load_model("qwen2.5-7b-score")->config().qkv_bias);

  auto parse = [](const std::string& j) { return parse_model_config(j, "cfg.json"); };
  const std::string base = R"("hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50,"torch_dtype":"bfloat16")";
  CHECK(parse(R"({"architectures":["Qwen3ForSequenceClassification"],"id2label":{"0":"a","1":"b","2":"c"},)" + base + "}").score_labels == 3);
  const ModelConfig tied = parse(R"({"architectures":["LlamaForTokenClassification"],"model_type":"llama","tie_word_embeddings":true,)" + base + "}");
  CHECK((tied.score_labels == 1 && !tied.tied_embeddings));
  CHECK(parse(R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","num_labels":4,)" + base + "}").score_labels == 0);
  CHECK(has(error_of([&] { parse(R"({"architectures":["LlamaForTokenClassification"],"num_labels":0,)" + base + "}"); }),
            "'num_labels'"));
  CHECK(has(error_of([&] { parse(R"({"architectures":["GPT2ForTokenClassification"],)" + base + "}"); }),
            "unknown architecture 'GPT2ForTokenClassification'"));
}

TEST_CASE("a job's reward may be a rule: no reward model-stage") {
  const std::string base = R"("prompts_per_step":8,"samples_per_prompt":2,"prompt_len":16,"max_response_len":32)";
  const JobSpec j = parse_job(R"({"algorithm":"grpo","models":{"actor":"tiny-llama","reference":"tiny-llama","reward":"rule"},)" + base + "}", "job.json");
  CHECK(j.rule_reward);
  CHECK(j.model("reward") == nullptr);
  for (const auto& phase : j.phases())
    for (const ModelStage& st : phase) CHECK(st.role != "reward");
  const JobSpec ppo = parse_job(R"({"algorithm":"ppo","models":{"actor":"tiny-llama","critic":"tiny-llama-value","reference":"tiny-llama","reward":"tiny-llama-value"},)" + base + "}", "job.json");
  CHECK_FALSE(ppo.rule_reward);
  CHECK(ppo.model("critic")->config().score_labels == 1);
  CHECK(has(error_of([&] { parse_job(R"({"algorithm":"grpo","models":{"actor":"tiny-llama","reference":"tiny-llama","reward":3},)" + base + "}", "job.json"); }),
            "or \"rule\" for a verifiable reward"));
}

TEST_CASE("layout specs parse and their errors name key and value") {
  const auto s = parse_collection_spec("tp=2,pp=2,dp=2,devices=0:4:1:5:2-3:6-7,partition=3/5,packing=fused");
  CHECK(s.layout.tp == 2);
  CHECK(s.layout.pp == 2);
  CHECK(s.dp == 2);
  CHECK(s.devices == std::vector<DeviceId>{0, 4, 1, 5, 2, 3, 6, 7});
  CHECK(s.layout.partition == std::vector<int>{3, 5});
  CHECK(s.layout.packing == Packing::fused);
  CHECK(parse_collection_spec("tp=4,pp=1,dp=2").devices == std::vector<DeviceId>{0, 1, 2, 3, 4, 5, 6, 7});
  auto err = [](const char* spec) { return error_of([&] { parse_collection_spec(spec); }); };
  CHECK(has(err("tp=x,pp=1,dp=1"), "tp=x"));
  CHECK(has(err("tp=0,pp=1,dp=1"), "tp=0"));
  CHECK(has(err("tp=2,pp=1,dp=1,devices=0:1:1"), "devices="));
  CHECK(has(err("tp=2,pp=1,dp=1,devices=0:0"), "device 0 appears twice"));
  CHECK(has(err("tp=2,pp=1,dp=1,devices=0:-3"), "-3"));
  CHECK(has(err("tp=2,pp=2,dp=1,partition=1/2/3"), "partition"));
  CHECK(has(err("tp=2,pp=1,dp=1,packing=vllm"), "packing=vllm"));
  CHECK(has(err("tp=2,zz=1"), "unknown key 'zz'"));
  CHECK(has(err("tp=2,tp=4"), "given twice"));
  CHECK(has(err("tp2"), "not key=value"));
  CHECK(has(err("tp=233020196,pp=19"), "too many"));  // found by the layout fuzzer: tp·pp overflowed int
  CHECK(has(err("tp=2147483647,pp=2147483647,dp=2147483647"), "too many"));
  const auto m = load_model("llama-3.1-8b")->config();
  CHECK(has(error_of([&] { validate_layout(m, Layout{3, 1, {}, Packing::hf}); }), "tp=3"));
  CHECK(has(error_of([&] { validate_layout(m, Layout{1, 40, {}, Packing::hf}); }), "pp=40"));
  CHECK(has(error_of([&] { validate_layout(m, Layout{1, 2, {10, 20}, Packing::hf}); }), "sums to 30"));
  CHECK(error_of([&] { validate_layout(m, Layout{16, 1, {}, Packing::hf}); }).empty());  // kv heads replicated
  CHECK(has(error_of([&] { validate_layout(load_model("qwen2.5-0.5b")->config(), Layout{7, 1, {}, Packing::hf}); }),
            "num_key_value_heads=2"));
}

TEST_CASE("a cluster's GPU names its compute units or takes its data sheet's; a bad count is one clear error") {
  const std::string base = R"({"name": "c", "nodes": 1, "gpus_per_node": 8, "intra_node_gbps": 100, "inter_node_gbps": 10,
                              "nics_per_node": 1, "gpu": {"name": "g", "memory_gib": 80, "bf16_tflops": 900, "hbm_gbps": 3000)";
  CHECK(parse_cluster(base + "}}", "c.json").gpu_compute_units == 0);  // "g": not a model the data sheets list
  CHECK(load_cluster("paper-cluster-2-a100").gpu_compute_units == 108);  // from the data sheet of its A100
  CHECK(parse_cluster(base + R"(, "compute_units": 132}})", "c.json").gpu_compute_units == 132);
  CHECK(has(error_of([&] { parse_cluster(base + R"(, "compute_units": -4}})", "c.json"); }), "'compute_units' must be positive"));
  CHECK(has(error_of([&] { parse_cluster(base + R"(, "compute_units": "many"}})", "c.json"); }), "'compute_units' must be an integer"));
}

TEST_CASE("JSON inputs with numbers out of range are one clear error (found by fuzzing)") {
  CHECK(has(error_of([] { parse_cluster(R"({"nodes": 6E6868})", "c.json"); }), "c.json: not valid JSON"));
  CHECK(has(error_of([] { parse_job(R"({"prompts_per_step": 1e999})", "j.json"); }), "j.json: not valid JSON"));
}

TEST_CASE("collections reject repeated, negative and out-of-range devices") {
  const auto m = load_model("tiny-llama");
  auto spec = parse_collection_spec("tp=2,pp=1,dp=2");
  CHECK_NOTHROW(Collection::from_spec(m, "a", spec, false));
  spec.devices = {0, 1, 1, 2};
  CHECK(has(error_of([&] { Collection::from_spec(m, "a", spec, false); }), "device 1 is used twice"));
  spec.devices = {0, 1, 2, 9};
  const auto c = Collection::from_spec(m, "a", spec, false);
  CHECK(has(error_of([&] { c.validate(8); }), "device id 9 is out of range"));
}

TEST_CASE("stages: part(L, pp, s), explicit partitions, tied embeddings on the last stage") {
  const Layout l{1, 3, {}, Packing::hf};
  CHECK(l.stage_layers(0, 32) == Range{0, 10});
  CHECK(l.stage_layers(2, 32) == Range{21, 32});
  for (int layer = 0; layer < 32; ++layer) {
    const int s = l.stage_of(layer, 32);
    CHECK(l.stage_layers(s, 32).contains(layer));
  }
  const Layout p{1, 3, {10, 12, 10}, Packing::hf};
  CHECK(p.stage_of(21, 32) == 1);
  CHECK(p.stage_of(22, 32) == 2);
  const auto tied = load_model("llama-3.2-1b");
  const TensorInfo& emb = tied->tensor(*tied->find(TensorKind::embed));
  CHECK(stage_holds(tied->config(), Layout{1, 4, {}, Packing::hf}, 3, emb));
  CHECK_FALSE(stage_holds(tied->config(), Layout{1, 4, {}, Packing::hf}, 2, emb));
}

TEST_CASE("kv heads replicate when tp > nkv") {
  const auto m = load_model("llama-3.1-8b");  // nkv = 8, hd = 128
  const TensorInfo& k = m->tensor(*m->find(TensorKind::k, 0));
  CHECK(tp_range(m->config(), k, 16, 0) == Range{0, 128});
  CHECK(tp_range(m->config(), k, 16, 1) == Range{0, 128});
  CHECK(tp_range(m->config(), k, 16, 15) == Range{896, 1024});
  CHECK(tp_range(m->config(), k, 4, 1) == Range{256, 512});
}

TEST_CASE("boxes and local views") {
  const Box a = Box::of_shape({10, 6});
  Box b = a;
  b.dims[0] = {2, 5};
  b.dims[1] = {1, 3};
  CHECK(a.contains(b));
  CHECK(b.elements() == 6);
  CHECK(a.intersect(b) == b);
  Box shard = a;
  shard.dims[0] = {2, 8};
  const LocalView v = local_view(b, shard, 100);
  CHECK(v.offset == 100 + 0 * 6 + 1);
  CHECK(v.strides[0] == 6);
  CHECK(v.strides[1] == 1);
  Box cols = a;
  cols.dims[1] = {3, 6};  // a column shard: local rows are 3 long
  Box piece = cols;
  piece.dims[1] = {4, 6};
  const LocalView c = local_view(piece, cols, 0);
  CHECK(c.offset == 1);
  CHECK(c.strides[0] == 3);
}

TEST_CASE("fused packing stacks q, k, v and gate, up by rows") {
  const auto m = load_model("tiny-llama");  // q rows 128, kv rows 32, I = 344
  const Layout fused{2, 1, {}, Packing::fused};
  const ShardPlace q = place_shard(*m, *m->find(TensorKind::q, 1), fused, 1);
  const ShardPlace k = place_shard(*m, *m->find(TensorKind::k, 1), fused, 1);
  const ShardPlace v = place_shard(*m, *m->find(TensorKind::v, 1), fused, 1);
  CHECK(q.buffer == *m->find(TensorKind::q, 1));
  CHECK(k.buffer == q.buffer);
  CHECK(q.base == 0);
  CHECK(k.base == 64 * 128);
  CHECK(v.base == 64 * 128 + 16 * 128);
  CHECK(buffer_name(*m, q.buffer, Packing::fused) == "model.layers.1.self_attn.qkv_proj.weight");
  const ShardPlace up = place_shard(*m, *m->find(TensorKind::up, 0), fused, 0);
  CHECK(up.base == 172 * 128);
  CHECK(buffer_name(*m, up.buffer, Packing::fused) == "model.layers.0.mlp.gate_up_proj.weight");
  CHECK(place_shard(*m, *m->find(TensorKind::k, 1), Layout{2, 1, {}, Packing::hf}, 1).base == 0);
}

TEST_CASE("verification fill follows sharding.md") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafull);
  CHECK(fill_seed("t", "param") == fnv1a64("t/param"));
  CHECK(fill_value(fill_seed("t", "param"), 5) == splitmix64(fnv1a64("t/param") ^ 5));
}

TEST_CASE("jobs: presets parse; model-stages by phase; errors name the field") {
  for (const auto& name : preset_names(PresetKind::job)) CHECK_NOTHROW(load_job(name));
  const JobSpec ppo = load_job("ppo-llama-3.1-8b");
  const auto phases = ppo.phases();
  REQUIRE(phases.size() == 3);
  CHECK(phases[0].size() == 1);
  CHECK(phases[0][0].name() == "actor/generate");
  std::vector<std::string> infer;
  for (const auto& s : phases[1]) infer.push_back(s.name());
  CHECK(infer == std::vector<std::string>{"actor/infer", "critic/infer", "reference/infer", "reward/infer"});
  CHECK(phases[2].size() == 2);
  CHECK(phases[2][1].name() == "critic/train");
  const JobSpec grpo = load_job("grpo-qwen3-14b");
  CHECK(grpo.model("critic") == nullptr);
  CHECK(grpo.phases()[1].size() == 3);
  CHECK(grpo.phases()[2].size() == 1);
  CHECK(grpo.samples_per_prompt == 8);
  auto err = [](const std::string& j) { return error_of([&] { parse_job(j, "job.json"); }); };
  const std::string rest = R"(,"prompts_per_step":4,"samples_per_prompt":1,"prompt_len":8,"max_response_len":16})";
  CHECK(has(err(R"({"algorithm":"dpo","models":{}})" ), "'algorithm' is 'dpo'"));
  CHECK(has(err(R"({"algorithm":"ppo","models":{"actor":"tiny-llama"})" + rest), "needs models.critic"));
  CHECK(has(err(R"({"algorithm":"grpo","models":{"actor":"tiny-llama","reference":"tiny-llama","reward":"tiny-llama","critic":"tiny-llama"})" + rest),
            "models.critic is not a role of grpo"));
  CHECK(has(err(R"({"algorithm":"grpo","models":{"actor":"nope","reference":"tiny-llama","reward":"tiny-llama"})" + rest), "models.actor"));
  CHECK(has(err(R"({"algorithm":"grpo","models":{"actor":"tiny-llama","reference":"tiny-llama","reward":"tiny-llama"},"prompts_per_step":4})"),
            "samples_per_prompt"));
}

TEST_CASE("mixture of experts: config fields, sparse layers, published sizes, errors") {
  const auto small = load_model("qwen3-30b-a3b");
  const auto big = load_model("qwen3-235b-a22b");
  CHECK(small->config().arch == Arch::qwen3_moe);
  CHECK(std::abs(static_cast<double>(small->parameters()) / 30.5e9 - 1) < 0.01);  // "30.5B total"
  CHECK(std::abs(static_cast<double>(big->parameters()) / 235e9 - 1) < 0.01);     // "235B total"
  const auto tiny = load_model("tiny-qwen3-moe");  // mlp_only_layers [0]: layer 0 is dense
  CHECK(tiny->find("model.layers.0.mlp.gate_proj.weight").has_value());
  CHECK_FALSE(tiny->find("model.layers.0.mlp.gate.weight").has_value());
  CHECK(tiny->find("model.layers.1.mlp.gate.weight").has_value());
  CHECK(tiny->find("model.layers.3.mlp.experts.5.down_proj.weight").has_value());
  CHECK_FALSE(tiny->find("model.layers.3.mlp.experts.6.down_proj.weight").has_value());
  CHECK(tiny->find("model.layers.2.self_attn.q_norm.weight").has_value());
  const TensorInfo& down = tiny->tensor(*tiny->find(TensorKind::expert_down, 2, 4));
  CHECK(down.name == "model.layers.2.mlp.experts.4.down_proj.weight");
  CHECK(down.shape[0] == 64);
  CHECK(down.shape[1] == 48);

  auto parse = [](const std::string& extra) {
    return error_of([&] {
      parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":64,"intermediate_size":96,"num_hidden_layers":4,
        "num_attention_heads":4,"vocab_size":50,"torch_dtype":"bfloat16")" + extra + "}", "moe.json");
    });
  };
  const std::string ok = R"(,"num_experts":6,"num_experts_per_tok":2,"moe_intermediate_size":16)";
  CHECK(parse(ok).empty());
  CHECK(has(parse(R"(,"num_experts_per_tok":2,"moe_intermediate_size":16)"), "'num_experts'"));
  CHECK(has(parse(R"(,"num_experts":6,"moe_intermediate_size":16)"), "'num_experts_per_tok'"));
  CHECK(has(parse(R"(,"num_experts":6,"num_experts_per_tok":2)"), "'moe_intermediate_size'"));
  CHECK(has(parse(R"(,"num_experts":2,"num_experts_per_tok":3,"moe_intermediate_size":16)"), "num_experts_per_tok"));
  CHECK(has(parse(ok + R"(,"mlp_only_layers":[7])"), "'mlp_only_layers' names layer 7"));
  CHECK(has(parse(ok + R"(,"mlp_only_layers":3)"), "'mlp_only_layers' must be a list"));
  CHECK(has(parse(ok + R"(,"decoder_sparse_step":0)"), "'decoder_sparse_step'"));
  const ModelConfig step2 = parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":4,"num_attention_heads":4,"vocab_size":50,"torch_dtype":"bfloat16","decoder_sparse_step":2,
      "mlp_only_layers":[3])" + ok + "}", "moe.json");
  CHECK_FALSE(step2.sparse_layer(0));
  CHECK(step2.sparse_layer(1));
  CHECK_FALSE(step2.sparse_layer(2));
  CHECK_FALSE(step2.sparse_layer(3));  // (3 + 1) mod 2 = 0, but listed in mlp_only_layers
}

TEST_CASE("DeepSeek-V3-style models: MLA, dense-first layers, shared experts, the float32 router bias, errors") {
  const auto v3 = load_model("deepseek-v3");
  const auto k2 = load_model("kimi-k2");
  CHECK(v3->config().arch == Arch::deepseek_v3);
  CHECK(k2->config().arch == Arch::deepseek_v3);  // model_type kimi_k2 is the same architecture
  // "671B total" (the MTP module of num_nextn_predict_layers is not part of the model), "1.04T".
  CHECK(std::abs(static_cast<double>(v3->parameters()) / 671e9 - 1) < 0.01);
  CHECK(std::abs(static_cast<double>(k2->parameters()) / 1.03e12 - 1) < 0.01);
  CHECK(v3->config().sparse_layers() == 58);  // first_k_dense_replace 3 of 61
  CHECK(k2->config().sparse_layers() == 60);
  CHECK_FALSE(v3->find("model.layers.61.self_attn.q_a_proj.weight").has_value());
  const TensorInfo& kvb = v3->tensor(*v3->find("model.layers.0.self_attn.kv_b_proj.weight"));
  CHECK(kvb.shape[0] == 128 * (128 + 128));
  CHECK(kvb.shape[1] == 512);
  const TensorInfo& bias = v3->tensor(*v3->find("model.layers.3.mlp.gate.e_score_correction_bias"));
  CHECK(bias.dtype == DType::f32);
  CHECK(bias.shape[0] == 256);
  CHECK(v3->tensor(*v3->find("model.layers.3.mlp.shared_experts.down_proj.weight")).shape[1] == 2048);
  CHECK_FALSE(v3->find("model.layers.2.mlp.gate.weight").has_value());  // dense-first
  // o_proj's columns are heads of v_head_dim; queries of dn + dr.
  const ModelConfig& c = v3->config();
  CHECK(tp_range(c, v3->tensor(*v3->find("model.layers.5.self_attn.o_proj.weight")), 8, 1).lo == 16 * 128);
  CHECK(tp_range(c, v3->tensor(*v3->find("model.layers.5.self_attn.q_b_proj.weight")), 8, 1).lo == 16 * 192);
  CHECK(tp_range(c, v3->tensor(*v3->find("model.layers.5.self_attn.kv_a_proj_with_mqa.weight")), 8, 1).size() == 576);

  const std::string base = R"("architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3","hidden_size":64,
    "intermediate_size":128,"moe_intermediate_size":32,"num_hidden_layers":3,"num_attention_heads":4,"vocab_size":256,
    "n_routed_experts":8,"num_experts_per_tok":2,"q_lora_rank":32,"kv_lora_rank":16,"qk_nope_head_dim":16,
    "qk_rope_head_dim":16,"v_head_dim":16,"torch_dtype":"bfloat16")";
  auto parse = [&](const std::string& extra) { return error_of([&] { parse_model_config("{" + base + extra + "}", "ds.json"); }); };
  CHECK(parse("").empty());
  CHECK(has(parse(R"(,"attention_bias":true)"), "'attention_bias' is true"));
  CHECK(has(parse(R"(,"quantization_config":{"weight_block_size":[128,128],"scale_fmt":"ue8m0"})"), "'quantization_config.scale_fmt'"));
  CHECK(has(parse(R"(,"quantization_config":{"weight_block_size":[128]})"), "weight_block_size"));
  CHECK(has(parse(R"(,"moe_layer_freq":0)"), "'moe_layer_freq'"));
  CHECK(has(error_of([&] {
          parse_model_config(R"({"model_type":"deepseek_v3","hidden_size":64,"intermediate_size":128,"num_hidden_layers":3,
            "num_attention_heads":4,"vocab_size":256,"n_routed_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32,
            "qk_nope_head_dim":16,"qk_rope_head_dim":16,"v_head_dim":16,"torch_dtype":"bfloat16"})", "ds.json");
        }),
        "'kv_lora_rank'"));
  // Nested under text_config (a multimodal wrapper), read from there.
  const ModelConfig nested = parse_model_config(R"({"architectures":["KimiVLForConditionalGeneration"],"text_config":{)" + base + "}}", "k.json");
  CHECK(nested.arch == Arch::deepseek_v3);
  CHECK(nested.kv_lora_rank == 16);
  // q_lora_rank null: q_proj straight from H; topk_method other than noaux_tc: no bias.
  const auto plain = testcase::model("tiny-mla-odd");
  CHECK(plain->find("model.layers.0.self_attn.q_proj.weight").has_value());
  CHECK_FALSE(plain->find("model.layers.0.self_attn.q_a_proj.weight").has_value());
  CHECK_FALSE(plain->find("model.layers.2.mlp.gate.e_score_correction_bias").has_value());
  CHECK(plain->find("model.layers.2.mlp.gate.weight").has_value());   // 2 ≥ 1 and 2 mod 2 = 0
  CHECK_FALSE(plain->find("model.layers.3.mlp.gate.weight").has_value());
  // Fused packing as vLLM: [q_a; kv_a] replicated, the shared experts' [gate; up].
  const auto tiny = load_model("tiny-deepseek-v3");
  CHECK(buffer_name(*tiny, *tiny->find(TensorKind::q_a, 1), Packing::fused) == "model.layers.1.self_attn.fused_qkv_a_proj.weight");
  CHECK(buffer_name(*tiny, *tiny->find(TensorKind::shared_gate, 1), Packing::fused) == "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
  CHECK(buffer_name(*tiny, *tiny->find(TensorKind::kv_b, 1), Packing::fused) == "model.layers.1.self_attn.kv_b_proj.weight");
}

TEST_CASE("MoE layouts: specs, validity errors naming the rule, sharding.md's worked examples") {
  const auto spec = parse_collection_spec("tp=2,pp=3,ep=4,etp=2,dp=2");
  CHECK(spec.layout.size() == 24);
  CHECK(spec.devices.size() == 48);
  CHECK(to_string(spec.layout) == "tp=2,pp=3,ep=4");  // etp = tp is the default
  CHECK(to_string(parse_collection_spec("tp=4,pp=1,ep=2,etp=1,dp=1").layout) == "tp=4,pp=1,ep=2,etp=1");
  CHECK(has(error_of([] { parse_collection_spec("tp=2,pp=1,ep=4,dp=1,devices=0-3"); }), "tp·pp·ep·dp = 8"));
  CHECK(has(error_of([] { parse_collection_spec("tp=2,pp=1,etp=0,dp=1"); }), "etp=0 must be at least 1"));

  const auto moe = load_model("qwen3-30b-a3b");  // E = 128, Ie = 768
  const auto dense = load_model("tiny-llama");
  auto invalid = [](const ModelSpec& m, const std::string& s) {
    return error_of([&] { validate_layout(m.config(), parse_collection_spec(s).layout); });
  };
  CHECK(has(invalid(*dense, "tp=1,pp=1,ep=2,dp=1"), "ep=2 needs a mixture-of-experts model"));
  CHECK(invalid(*dense, "tp=2,pp=1,etp=1,dp=1").empty());  // dense models ignore etp
  CHECK(Collection::from_spec(dense, "s", parse_collection_spec("tp=2,pp=1,etp=1,dp=1"), false).units[0].layout ==
        Collection::from_spec(dense, "s", parse_collection_spec("tp=2,pp=1,dp=1"), false).units[0].layout);
  CHECK(Collection::from_spec(moe, "s", parse_collection_spec("tp=2,pp=1,ep=2,etp=2,dp=1"), false).units[0].layout ==
        Collection::from_spec(moe, "s", parse_collection_spec("tp=2,pp=1,ep=2,dp=1"), false).units[0].layout);
  CHECK(has(invalid(*load_model("qwen3-235b-a22b"), "tp=8,pp=1,ep=1024,etp=64,dp=1"), "exceeds 4096 GPUs per pipeline stage"));
  CHECK(has(invalid(*moe, "tp=2,pp=1,ep=3,etp=4,dp=1"), "etp=4 does not divide tp·ep = 6"));
  CHECK(has(invalid(*moe, "tp=4,pp=1,ep=64,etp=1,dp=1"), "256 expert groups exceed num_experts=128"));
  CHECK(has(invalid(*moe, "tp=3,pp=1,dp=1"), "tp=3 does not divide num_attention_heads"));
  CHECK(invalid(*load_model("tiny-qwen3-moe"), "tp=2,pp=1,ep=3,etp=1,dp=1").empty());  // 6 groups of one expert
  CHECK(has(invalid(*load_model("tiny-qwen3-moe"), "tp=8,pp=1,ep=1,etp=1,dp=1"), "8 expert groups exceed num_experts=6"));

  // One unit per row of the table: GPUs per unit, expert groups, experts on each GPU and
  // the share of each expert's Ie it holds.
  struct Row {
    std::string layout;
    int gpus, groups, experts_per_gpu, ie_rows;
  };
  for (const Row& row : {Row{"tp=8,pp=1,ep=1,dp=1", 8, 1, 128, 96}, Row{"tp=4,pp=1,ep=2,etp=1,dp=1", 8, 8, 16, 768},
                         Row{"tp=2,pp=1,ep=2,etp=1,dp=1", 4, 4, 32, 768}, Row{"tp=2,pp=1,ep=4,etp=2,dp=1", 8, 4, 32, 384},
                         Row{"tp=1,pp=16,ep=16,etp=1,dp=1", 256, 16, 8, 768}}) {
    CAPTURE(row.layout);
    const Layout l = parse_collection_spec(row.layout).layout;
    CHECK_NOTHROW(validate_layout(moe->config(), l));
    CHECK(l.size() == row.gpus);
    CHECK(l.expert_groups() == row.groups);
    const int s = l.pp - 1;  // a stage holding layer 47
    for (int g = 0; g < l.stage_size(); ++g) {
      int held = 0;
      for (int x = 0; x < 128; ++x)
        if (auto b = shard_box(moe->config(), l, s, g, moe->tensor(*moe->find(TensorKind::expert_gate, 47, x)))) {
          ++held;
          CHECK(b->dims[0].size() == row.ie_rows);
        }
      CHECK(held == row.experts_per_gpu);
    }
  }
}

TEST_CASE("fused packing stacks local experts: w13 = [gate; up] per expert, w2 per expert") {
  const auto m = load_model("tiny-qwen3-moe");  // E = 6, Ie = 48, H = 64
  const Layout l{2, 1, {}, Packing::fused, 2, 2};  // 2 groups of 3 experts, each split 2 ways
  // GPU g = 3: group 1 (experts 3, 4, 5), expert rank 1 (Ie rows 24..48).
  const ShardPlace gate4 = place_shard(*m, *m->find(TensorKind::expert_gate, 1, 4), l, 3);
  const ShardPlace up4 = place_shard(*m, *m->find(TensorKind::expert_up, 1, 4), l, 3);
  const ShardPlace down5 = place_shard(*m, *m->find(TensorKind::expert_down, 1, 5), l, 3);
  CHECK(gate4.buffer == *m->find(TensorKind::expert_gate, 1, 3));
  CHECK(up4.buffer == gate4.buffer);
  CHECK(gate4.base == 1 * 2 * 24 * 64);
  CHECK(up4.base == 1 * 2 * 24 * 64 + 24 * 64);
  CHECK(gate4.shard.dims[0].lo == 24);
  CHECK(down5.buffer == *m->find(TensorKind::expert_down, 1, 3));
  CHECK(down5.base == 2 * 64 * 24);
  CHECK(down5.shard.dims[1].lo == 24);
  CHECK(buffer_name(*m, gate4.buffer, Packing::fused) == "model.layers.1.mlp.experts.w13_weight");
  CHECK(buffer_name(*m, down5.buffer, Packing::fused) == "model.layers.1.mlp.experts.w2_weight");
  CHECK(buffer_name(*m, *m->find(TensorKind::router, 1), Packing::fused) == "model.layers.1.mlp.gate.weight");
}

TEST_CASE("trace events: microseconds to the nanosecond, no rounding dust below zero, overlapping events on lanes") {
  TraceEvents t;
  t.process(1, "devices");
  // A start computed as a − offset − origin can land a hair below the origin.
  const double a = 0.1, offset = 0.7, origin = a - offset;
  t.complete(1, "device 0", "first", (a - offset) - origin - 1.7e-21, 200e-6);
  t.complete(1, "device 0", "beside", 100e-6, 200e-6);  // overlaps the first: another lane
  t.instant(1, "device 0", "mark", 1.2345678912e-3);
  const nlohmann::json j = nlohmann::json::parse(t.dump());
  std::map<std::string, nlohmann::json> e;  // the events by name (lanes add metadata events)
  for (const auto& x : j["traceEvents"])
    if (x["ph"] != "M") e[x["name"].get<std::string>()] = x;
  REQUIRE(e.size() == 3);
  CHECK(e["first"]["ts"].get<double>() == 0.0);
  CHECK_FALSE(std::signbit(e["first"]["ts"].get<double>()));
  CHECK(e["first"]["dur"].get<double>() == doctest::Approx(200.0));
  CHECK(e["beside"]["tid"] != e["first"]["tid"]);
  CHECK(e["mark"]["ts"].get<double>() == doctest::Approx(1234.568));
}
