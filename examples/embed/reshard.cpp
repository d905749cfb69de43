// Embedding Nereus from C++: plan a reshard of a model's training state from one layout
// to another, allocate the source and target units in host device arenas, fill the
// sources with the verification fill of sharding.md, move the bytes with the executor
// over the local transport, and check every destination byte.
//
//   c++ -std=c++20 reshard.cpp $(pkg-config --cflags --libs nereus) -o reshard
//   ./reshard [MODEL] [FROM] [TO]      (default: tiny-llama tp=4 -> tp=2,dp=2, training state)
#include <nereus/base/error.hpp>
#include <nereus/runtime/executor.hpp>
#include <nereus/runtime/participant.hpp>
#include <nereus/runtime/unit_store.hpp>
#include <nereus/transport/local.hpp>

#include <cstdio>
#include <exception>

namespace asio = nereus::asio;

int main(int argc, char** argv) {
  nereus::ReshardSpec spec;
  spec.model = argc > 1 ? argv[1] : "tiny-llama";
  spec.from = argc > 2 ? argv[2] : "tp=4,pp=1,dp=1,devices=0-3";
  spec.to = argc > 3 ? argv[3] : "tp=2,pp=1,dp=2,devices=0-3";
  spec.train = true;  // params, gradients' place and Adam state move together
  try {
    // Planning is pure: which boxes go where, over which links, fewest bytes.
    const nereus::PreparedReshard p = nereus::prepare_reshard(spec);
    const auto& sum = p.plan.summary();
    std::printf("plan: %zu transfers, %.3f MB over links, %.3f MB kept in place (%.2f ms)\n",
                static_cast<std::size_t>(sum.transfer_count), sum.moved_bytes / 1e6, sum.kept_bytes / 1e6, sum.plan_ms);

    // Units in this process's device arenas (capacity 0: each sized to what it holds).
    nereus::UnitStore store(p.plan, p.devices, 0, 0);
    store.allocate_and_fill(2);

    // The executor moves the bytes; one process owns every device, so every copy is local.
    nereus::LocalTransport local;
    nereus::Executor ex(local, nullptr, [](nereus::DeviceId) { return nereus::PeerId{0}; });
    const auto transfers = p.plan.transfers();
    const nereus::BoundTransition bound = ex.bind(transfers, p.target, store.table());
    asio::io_context io;
    nereus::ExecutionReport report;
    std::exception_ptr failure;
    asio::co_spawn(io, ex.run(bound), [&](std::exception_ptr e, nereus::ExecutionReport r) {
      failure = e;
      report = std::move(r);
    });
    io.run();
    if (failure) std::rethrow_exception(failure);

    const nereus::FillCheck check = store.verify_targets(2);
    std::printf("moved: %.3f MB in %.4f s; %zu units committed; verified %s (%.3f MB)\n",
                (report.link_bytes + report.local_bytes) / 1e6, report.seconds, report.commits.size(),
                check.ok ? "every destination byte" : ("MISMATCH: " + check.first_error).c_str(), check.bytes / 1e6);
    return check.ok ? 0 : 1;
  } catch (const nereus::Error& e) {
    std::fprintf(stderr, "reshard: error: %s\n", e.what());
    return 2;
  }
}
