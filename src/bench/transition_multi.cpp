// Several worker processes, devices split evenly, bytes over UCX. The parent spawns the
// workers, relays their UCX addresses, rkeys and buffer addresses, starts each run and
// times it; a worker pulls (UCX get) what its devices receive.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "control.hpp"
#include "nereus/base/progress.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/inbox.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/ucx.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

namespace {

using clock = std::chrono::steady_clock;

/// Messages from all workers, in arrival order; end of stream arrives as {"type":"eof"}.
using Inbox = nereus::Inbox<json>;

asio::awaitable<void> pump(Socket& s, int rank, Inbox& inbox) {
  for (;;) {
    json m = co_await receive(s);
    if (m.empty()) {
      inbox.push({{"type", "eof"}, {"rank", rank}});
      co_return;
    }
    m["rank"] = rank;
    inbox.push(std::move(m));
  }
}

struct Child {
  pid_t pid = -1;
  std::unique_ptr<Socket> socket;
  bool alive = true;
};

std::string exit_text(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
      return "exited with status " + std::to_string(WEXITSTATUS(status));
    }
    ::usleep(10000);
  }
  return "stopped answering";
}

/// The parent's whole run as one coroutine; fills `out`.
asio::awaitable<void> parent(asio::io_context& io, const TransitionConfig& c, const Prepared& p, std::vector<Child>& kids,
                             json& out) {
  Inbox inbox(io.get_executor());
  AsyncScope pumps(io.get_executor());  // joined below, before the inbox goes away
  for (int r = 0; r < c.procs; ++r) pumps.spawn(pump(*kids[r].socket, r, inbox));
  const auto deadline = [&] { return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(c.timeout_seconds)); };
  std::string error;

  // Collects one `type` message from each live worker; a death or failure ends the phase.
  // Stops at the first death or failure when `fail_fast`.
  auto gather = [&](const char* type, clock::time_point until, bool fail_fast = true) -> asio::awaitable<std::map<int, json>> {
    std::map<int, json> got;
    int live = 0;
    for (const auto& k : kids) live += k.alive;
    while (static_cast<int>(got.size()) < live) {
      std::optional<json> next = co_await inbox.next(until);
      json m = next ? std::move(*next) : json::object();
      if (m.empty()) {
        error = "timed out after " + std::to_string(c.timeout_seconds) + " s waiting for '" + std::string(type) + "'";
        break;
      }
      const int r = m["rank"].get<int>();
      const std::string t = m["type"];
      if (t == "eof") {
        kids[r].alive = false;
        if (error.empty()) error = "worker " + std::to_string(r) + " (pid " + std::to_string(kids[r].pid) + ") " + exit_text(kids[r].pid) + " during '" + std::string(type) + "'";
        if (fail_fast) break;  // do not wait on workers that may be stuck on the dead one
        --live;
        continue;
      }
      if (t == "failed") {
        if (error.empty()) error = "worker " + std::to_string(r) + ": " + m.value("error", std::string("?"));
        got[r] = m;
        if (fail_fast) {
          // A transport that sees a peer die (tagged sends do) fails before the parent sees
          // the death: a worker that died meanwhile is the cause, so it is what is named.
          const auto grace = std::min(until, clock::now() + std::chrono::milliseconds(500));
          while (std::optional<json> more = co_await inbox.next(grace)) {
            if ((*more)["type"] != "eof") continue;
            const int dead = (*more)["rank"].get<int>();
            kids[dead].alive = false;
            error = "worker " + std::to_string(dead) + " (pid " + std::to_string(kids[dead].pid) + ") " +
                    exit_text(kids[dead].pid) + " during '" + std::string(type) + "' (then " + error + ")";
            break;
          }
          break;
        }
        continue;
      }
      if (t == type) got[r] = m;
    }
    co_return got;
  };
  auto broadcast = [&](const json& m) -> asio::awaitable<void> {
    for (auto& k : kids)
      if (k.alive) {
        try {
          co_await send(*k.socket, m);
        } catch (const std::exception&) {
          k.alive = false;
        }
      }
  };

  auto ready = co_await gather("ready", deadline());
  if (error.empty()) {
    json workers = json::array();
    for (auto& [r, m] : ready) workers.push_back(m);
    {
      const json msg = {{"type", "peers"}, {"workers", workers}};
      co_await broadcast(msg);
    }
    co_await gather("connected", deadline());
  }
  std::vector<double> secs;
  json last_done;
  double detected = 0;  // seconds from the failing run's start to the failure being known
  Progress progress("bench transition", c.repeat, "runs", c.quiet || c.json);
  std::vector<double> quantize_secs;
  for (int i = 0; i < c.repeat && error.empty(); ++i) {
    const auto t0 = clock::now();
    if (p.plan.summary().quantized_bytes > 0) {
      // bf16 → FP8: every worker quantizes what it sends, then all run (a receiver gets
      // from its sender's staging). The run's time counts both.
      {
        const json msg = {{"type", "quantize"}};
        co_await broadcast(msg);
      }
      co_await gather("quantized", deadline());
      quantize_secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      if (!error.empty()) break;
    }
    {
      const json msg = {{"type", "run"}, {"iteration", i}, {"last", i + 1 == c.repeat}};
      co_await broadcast(msg);
    }
    auto done = co_await gather("done", deadline());
    secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    if (!error.empty()) detected = secs.back();
    std::uint64_t link = 0, local = 0;
    std::map<int, json> timings;
    for (auto& [r, m] : done) {
      link += m.value("link_bytes", std::uint64_t{0});
      local += m.value("local_bytes", std::uint64_t{0});
      if (m.contains("timings")) timings[r] = m["timings"];
    }
    last_done = {{"link_bytes", link}, {"local_bytes", local}};
    if (error.empty() && i + 1 == c.repeat) {
      const TransferLabels labels = transfer_labels(c, p);
      if (wants_timings(c)) write_transfer_outputs(c, labels, timings);
      last_done["transports"] = transports_json(labels, timings);
    }
    progress.update(i + 1);
  }
  progress.finish();
  if (!error.empty()) {
    const std::string first = error;
    // Stop whoever still runs; the sources must still verify.
    {
      const json msg = {{"type", "abort"}};
      co_await broadcast(msg);
    }
    co_await gather("aborted", clock::now() + std::chrono::seconds(10), false);
    {
      const json msg = {{"type", "verify"}, {"sources_only", true}};
      co_await broadcast(msg);
    }
    auto v = co_await gather("verified", clock::now() + std::chrono::seconds(60), false);
    bool ok = !v.empty();
    for (auto& [r, m] : v) ok = ok && m.value("sources_ok", false);
    out.update(failure_figures(first, detected, ok, v.size()));
  } else {
    const auto copied = last_done["link_bytes"].get<std::uint64_t>() + last_done["local_bytes"].get<std::uint64_t>();
    out.update(run_figures(p, secs, copied, quantize_secs));
    if (last_done.contains("transports")) out["transports"] = last_done["transports"];
    out["verified"] = nullptr;
    if (c.verify) {
      {
        const json msg = {{"type", "verify"}, {"sources_only", false}};
        co_await broadcast(msg);
      }
      auto v = co_await gather("verified", deadline());
      bool ok = error.empty() && static_cast<int>(v.size()) == c.procs;
      std::uint64_t bytes = 0;
      for (auto& [r, m] : v) {
        ok = ok && m.value("targets_ok", false) && m.value("sources_ok", false);
        bytes += m.value("bytes", std::uint64_t{0});
        if (!m.value("targets_ok", true) && !out.contains("verify_error")) out["verify_error"] = m.value("error", std::string());
      }
      out["verified"] = ok;
      out["verified_bytes"] = bytes;
    }
    if (!c.dump_dir.empty() && error.empty()) {
      {
        const json msg = {{"type", "dump"}, {"dir", c.dump_dir}};
        co_await broadcast(msg);
      }
      auto d = co_await gather("dumped", deadline());
      json files = json::array();
      for (auto& [r, m] : d)
        for (auto& f : m["files"]) files.push_back(f);
      std::ofstream(std::filesystem::path(c.dump_dir) / "manifest.json") << json{{"files", files}}.dump(1) << "\n";
    }
    if (!error.empty()) out["error"] = error;
  }
  {
    const json msg = {{"type", "exit"}};
    co_await broadcast(msg);
  }
  for (auto& k : kids) k.socket->close();
  co_await pumps.join();
}

}  // namespace

int run_parent(const TransitionConfig& c, const std::string& self_exe, const std::vector<std::string>& argv) {
  Prepared p = prepare(c);
  if (!c.cuda) check_host_memory(p);  // every worker runs on this machine
  asio::io_context io;
  std::vector<Child> kids(static_cast<std::size_t>(c.procs));
  for (int r = 0; r < c.procs; ++r) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw Error("socketpair failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("fork failed");
    if (pid == 0) {
      ::close(sv[0]);
      const int fd = ::dup(sv[1]);  // without CLOEXEC
      std::vector<std::string> args = argv;
      args.insert(args.end(), {"--worker-rank", std::to_string(r), "--control-fd", std::to_string(fd)});
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      ::execv(self_exe.c_str(), cargs.data());
      ::_exit(127);
    }
    ::close(sv[1]);
    kids[r].pid = pid;
    kids[r].socket = std::make_unique<Socket>(io, asio::local::stream_protocol(), sv[0]);
  }
  json out;
  std::exception_ptr err;
  asio::co_spawn(io, parent(io, c, p, kids, out), [&](std::exception_ptr e) { err = e; });
  io.run();
  // Workers exit on "exit" or when their socket closes; make sure none lingers.
  for (auto& k : kids) {
    int status = 0;
    for (int i = 0; i < 500 && ::waitpid(k.pid, &status, WNOHANG) == 0; ++i) ::usleep(10000);
    if (::waitpid(k.pid, &status, WNOHANG) == 0) {
      ::kill(k.pid, SIGKILL);
      ::waitpid(k.pid, &status, 0);
    }
  }
  if (err) std::rethrow_exception(err);
  return report(c, p, std::move(out));
}

}  // namespace nereus::bench
