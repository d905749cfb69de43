// The nccl transport's parts that need no GPU: the rank table every process derives, and
// one clear error for a missing library or GPU. Its data path is in the GPU suite.
#include <doctest/doctest.h>

#include "test_util.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/nccl.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {

NcclTransportOptions group(PeerId self, int devices, int per_process, int gpus_per_process) {
  NcclTransportOptions o;
  o.self = self;
  for (DeviceId d = 0; d < devices; ++d) o.devices.push_back(d);
  o.owner_of = [per_process](DeviceId d) { return static_cast<PeerId>(d / per_process); };
  o.gpu_of = [gpus_per_process](DeviceId d) { return d % gpus_per_process; };  // logical devices share GPUs
  return o;
}

}  // namespace

TEST_CASE("nccl ranks: one per (process, GPU), sorted, whatever order the devices come in") {
  auto o = group(0, 8, 4, 2);
  const std::vector<NcclRank> want = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  CHECK(nccl_ranks(o) == want);
  std::reverse(o.devices.begin(), o.devices.end());
  CHECK(nccl_ranks(o) == want);
  // One GPU per process (torchrun's layout): rank = process.
  const auto single = nccl_ranks(group(0, 6, 2, 1));
  REQUIRE(single.size() == 3);
  for (std::size_t r = 0; r < single.size(); ++r) CHECK(single[r] == NcclRank{static_cast<PeerId>(r), 0});
}

TEST_CASE("nccl transport, without NCCL or a GPU: one error naming what is missing") {
  asio::io_context io;
  if (!nccl_built()) {
    CHECK(has(error_of([&] { make_nccl_transport(io, group(0, 4, 2, 1)); }), "this build has no NCCL transport"));
    return;
  }
  auto missing = group(0, 4, 2, 1);
  missing.library = "libnccl-not-here.so.2";
  if (!std::getenv("NEREUS_NCCL_LIBRARY"))
    CHECK(has(error_of([&] { make_nccl_transport(io, missing); }), "cannot load NCCL from libnccl-not-here.so.2"));
  if (cuda_device_count() == 0)
    CHECK(has(error_of([&] { make_nccl_transport(io, group(1, 4, 2, 1)); }), "nccl: this process's rank 1 is on GPU 0, but this machine has 0 CUDA device(s)"));
  auto outside = group(5, 4, 2, 1);  // a process holding none of the devices
  if (cuda_device_count() > 0)
    CHECK(has(error_of([&] { make_nccl_transport(io, outside); }), "holds none of the group's devices"));
}
