// On a GPU machine (benches/gpu/run.sh): a framework process as node RANK of a cluster on
// CUDA devices (cluster/member.hpp, DaemonOptions::device_kind = cuda), whose units of
// STAGES in the job's first plan are its own GPU memory: buffers carved out of one
// cudaMalloc block per GPU, as PyTorch's caching allocator places tensors, holding the
// verification fill (adopt=, docs/cluster.md). The coordinator's transition then reads
// them from the other daemon through CUDA IPC (the key names the block, the get the
// tensor's bounds) or, with MACHINE set, as staged UCX messages; the job's check verifies
// what arrived. At each step it checks that every view is GPU memory on its device's GPU
// and holds the fill, then prints one JSON line when the job on this node ends.
// MEMORY host runs the same on host memory (malloc blocks), so that the program itself is
// tested where no GPU is (tests/test_member.py).
//
//   gpu_member MEMORY COORDINATOR RANK NODES TOKEN_FILE JOB PLAN STAGE[,STAGE...] [DEVICES] [MACHINE]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "nereus/base/error.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/member.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/cuda.hpp"

namespace cluster = nereus::cluster;
using namespace nereus;

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

int main(int argc_in, char** argv_in) {
  if (argc_in < 9 || (std::string(argv_in[1]) != "cuda" && std::string(argv_in[1]) != "host")) {
    std::fprintf(stderr, "usage: gpu_member cuda|host COORDINATOR RANK NODES TOKEN_FILE JOB PLAN STAGE[,STAGE...] [DEVICES] [MACHINE]\n");
    return 2;
  }
  const bool gpu = std::string(argv_in[1]) == "cuda";
  const int argc = argc_in - 1;
  char** argv = argv_in + 1;
  std::vector<void*> blocks;
  auto release = [&] {
    for (void* p : blocks) gpu ? (void)cudaFree(p) : std::free(p);
  };
  auto copy = [&](void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
    if (gpu) check(cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
    else std::memcpy(dst, src, n);
  };
  try {
    cluster::DaemonOptions o;
    cluster::LaunchArgs launch;
    launch.coordinator = argv[1];
    launch.node_rank = std::atoi(argv[2]);
    launch.nodes = std::atoi(argv[3]);
    o.launch = cluster::resolve_launch(launch, [](const char* k) { return std::getenv(k); });
    o.token = cluster::load_token(argv[4]);
    o.devices = argc > 8 ? std::atoi(argv[8]) : 2;
    o.device_capacity = 1ull << 30;
    o.device_kind = gpu ? MemoryKind::cuda : MemoryKind::host;
    if (argc > 9) o.machine = argv[9];
    const int gpus = gpu ? cuda_device_count() : 1;
    if (gpus < 1) throw Error("no CUDA device");

    // This node's buffers of STAGES in the first plan, in one block per GPU.
    const JobSpec job = load_job(argv[5]);
    const GlobalPlan plan = load_global_plan(job, argv[6]);
    const std::vector<Collection> colls = plan_collections(job, plan);
    const auto first = static_cast<DeviceId>(*launch.node_rank * o.devices);
    auto gpu_of = [&](DeviceId d) { return static_cast<int>(d - first) % gpus; };  // the daemon's rule
    struct Want {
      AdoptedBuffer entry;
      BufferSpec spec;
      std::shared_ptr<const ModelSpec> model;
      std::size_t offset = 0;
    };
    std::vector<Want> wants;
    std::map<int, std::size_t> block_bytes;
    for (const std::string& stage : split(argv[7], ','))
      for (const Collection& c : colls) {
        if (c.model_stage != stage) continue;
        for (std::size_t r = 0; r < c.units.size(); ++r) {
          Collection one = c;
          one.units = {c.units[r]};
          std::vector<DeviceId> mine;
          for (DeviceId d : c.units[r].gpus)
            if (d >= first && d < first + static_cast<DeviceId>(o.devices)) mine.push_back(d);
          for (const BufferSpec& b : collection_buffers(one, 0, mine)) {
            Want w{{stage, static_cast<int>(r), b.key.device, buffer_name(*c.model, b.key.buffer, b.packing), b.key.slot, nullptr,
                    b.bytes(), o.device_kind, gpu ? gpu_of(b.key.device) : 0},
                   b, c.model, 0};
            std::size_t& end = block_bytes[w.entry.gpu];
            w.offset = end + 4096;  // a gap: neighbours no get may read
            end = w.offset + ((b.bytes() + 511) / 512) * 512;
            wants.push_back(std::move(w));
          }
        }
      }
    if (wants.empty()) throw Error(std::string("no buffer of ") + argv[7] + " on node " + argv[2] + " in the plan");
    std::map<int, std::byte*> block;
    for (auto& [g, bytes] : block_bytes) {
      void* p = nullptr;
      if (gpu) {
        check(cudaSetDevice(g), "cudaSetDevice");
        check(cudaMalloc(&p, bytes + 4096), "cudaMalloc");
      } else if (!(p = std::aligned_alloc(4096, (bytes + 8191) / 4096 * 4096))) {
        throw Error("out of host memory");
      }
      blocks.push_back(p);
      block[g] = static_cast<std::byte*>(p);
    }
    for (Want& w : wants) {
      std::vector<std::byte> host(w.spec.bytes());
      fill_buffer(*w.model, w.spec, host.data());
      w.entry.data = block[w.entry.gpu] + w.offset;
      copy(w.entry.data, host.data(), host.size(), cudaMemcpyHostToDevice);
      o.adopt.push_back(w.entry);
    }

    cluster::Member m(o);
    std::fprintf(stderr, "node %d listening on %s, %zu buffers adopted\n", *launch.node_rank, m.listening().str().c_str(), wants.size());
    int steps = 0;
    std::uint64_t views = 0, on_gpu = 0, adopted_views = 0, fill_ok = 0;
    std::string first_error;
    auto in_blocks = [&](const std::byte* p) {
      for (auto& [g, b] : block)
        if (p >= b && p < b + block_bytes[g]) return true;
      return false;
    };
    while (auto step = m.next_step()) {
      ++steps;
      for (const cluster::NodeUnit& u : step->units)
        for (std::size_t b = 0; b < u.buffers.size(); ++b) {
          ++views;
          on_gpu += u.kind == o.device_kind && u.gpu.size() == u.buffers.size() &&
                    u.gpu[b] == (gpu ? gpu_of(u.buffers[b].key.device) : 0);
          adopted_views += step->step == 1 && in_blocks(u.memory[b].data());
          std::vector<std::byte> host(u.memory[b].size());
          copy(host.data(), u.memory[b].data(), host.size(), cudaMemcpyDeviceToHost);
          const FillCheck fc = check_buffer(*step->job->model(std::string(role_of(u.model_stage))), u.buffers[b], host.data());
          fill_ok += fc.ok;
          if (!fc.ok && first_error.empty()) first_error = fc.first_error;
          for (char& ch : first_error)
            if (ch == '"' || ch == '\\') ch = '\'';  // it goes into a JSON string
        }
      m.report({{}, step->response_len, step->response_len, 0});
    }
    std::printf("{\"adopted\": %zu, \"steps\": %d, \"views\": %llu, \"views_on_their_gpu\": %llu, \"step1_views_adopted\": %llu, "
                "\"views_holding_the_fill\": %llu, \"first_error\": \"%s\"}\n",
                wants.size(), steps, static_cast<unsigned long long>(views), static_cast<unsigned long long>(on_gpu),
                static_cast<unsigned long long>(adopted_views), static_cast<unsigned long long>(fill_ok), first_error.c_str());
    release();
    return 0;
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (char& ch : what)
      if (ch == '"' || ch == '\\') ch = '\'';
    std::printf("{\"error\": \"%s\"}\n", what.c_str());
    release();
    return 1;
  }
}
