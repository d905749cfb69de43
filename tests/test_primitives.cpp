// Split, Merge, Extend, Destroy, Sync as transformations of EMU collections.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include "nereus/base/error.hpp"
#include "nereus/plan/primitives.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {
Collection coll(const std::string& spec, bool train = true) {
  return Collection::from_spec(load_model("tiny-llama"), "actor/train", parse_collection_spec(spec), train);
}
}  // namespace

TEST_CASE("split: one unit becomes k smaller units on the same GPUs") {
  const auto c = coll("tp=4,pp=1,dp=1,devices=3:2:1:0");
  const auto s = split(c, 0, Layout{2, 1, {}, Packing::hf});
  REQUIRE(s.dp() == 2);
  CHECK(s.units[0].gpus == std::vector<DeviceId>{3, 2});
  CHECK(s.units[1].gpus == std::vector<DeviceId>{1, 0});
  const auto plan = compile(c, s);
  // Each GPU keeps its quarter and receives the other quarter of its new half.
  CHECK(plan.summary().moved_bytes == plan.summary().lower_bound_bytes);
  CHECK(plan.summary().local_bytes > 0);
  CHECK(error_of([&] { split(c, 0, Layout{3, 1, {}, Packing::hf}); }).find("does not") != std::string::npos);
}

TEST_CASE("merge: replicas become one larger unit; shards already in place are not copied") {
  const auto c = coll("tp=2,pp=1,dp=2");
  const std::size_t units[] = {0, 1};
  const auto m = merge(c, units, Layout{4, 1, {}, Packing::hf});
  REQUIRE(m.dp() == 1);
  CHECK(m.units[0].gpus == std::vector<DeviceId>{0, 1, 2, 3});
  const auto plan = compile(c, m);
  // Ranks 0 and 3 of tp=4 sit inside their tp=2 shards; ranks 1 and 2 receive.
  CHECK(plan.summary().moved_bytes < plan.summary().target_bytes / 2);
  CHECK(error_of([&] { merge(c, std::span<const std::size_t>(units, 1), Layout{4, 1, {}, Packing::hf}); })
            .find("at least two") != std::string::npos);
}

TEST_CASE("extend: new replicas on new GPUs, fed from the existing ones") {
  const auto c = coll("tp=2,pp=1,dp=1");
  const DeviceId gpus[] = {4, 5, 6, 7};
  const auto e = extend(c, gpus);
  REQUIRE(e.dp() == 3);
  const auto plan = compile(c, e);
  CHECK(plan.summary().moved_bytes == 2 * plan.summary().target_bytes / 3);
  const DeviceId clash[] = {1, 8};
  CHECK(error_of([&] { extend(c, clash); }).find("used twice") != std::string::npos);
}

TEST_CASE("destroy: drops a replica and moves nothing; never the last one") {
  const auto c = coll("tp=2,pp=1,dp=2");
  const auto d = destroy(c, 1);
  CHECK(d.dp() == 1);
  const auto plan = compile(c, d);
  CHECK(plan.summary().moved_bytes == 0);
  CHECK(plan.summary().kept_bytes == plan.summary().target_bytes);
  CHECK(error_of([&] { destroy(d, 0); }).find("last replica") != std::string::npos);
}

TEST_CASE("sync: params of the training stage into the generation stage") {
  const auto train = coll("tp=2,pp=2,dp=1");
  const auto gen = Collection::from_spec(load_model("tiny-llama"), "actor/generate",
                                         parse_collection_spec("tp=1,pp=1,dp=2,devices=4:5"), false);
  const auto plan = compile(train, sync_target(train, gen));
  for (const auto& t : plan.transfers()) CHECK(t.slot == Slot::param);
  CHECK(plan.summary().moved_bytes == plan.summary().target_bytes);  // no GPU in common
}
