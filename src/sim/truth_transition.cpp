// The ground truth of a transition (truth.hpp, GroundTruth::run_transition): the graph's
// builds run on the cluster's links as flows that share them, written from the hardware
// and independent of the cost model (nothing here reads control/ or a graph node's
// estimated duration or start). Which bytes move where is the plan's (plan_build).
//
// - Each build first pays its messages' setup, one after another on its busiest GPU (the
//   per-message latencies of copy_seconds: 3 µs over NVLink, 8 µs across nodes), then
//   its bytes flow. Per message size this is the usual latency-bandwidth shape: a 1 MiB
//   message over NVLink at 240 GB/s reaches 1/(1 + 3 µs × 240 GB/s / 1 MiB) ≈ 59% of the
//   link, a 64 MiB one 99%.
// - Flows share links max-min fairly, each flow getting its equal share of the tightest
//   link it uses: every GPU's NVLink port out and in (80% of the data sheet's per-GPU
//   figure, intra_efficiency), every node's NICs out and in (85%, inter_efficiency, slowed
//   by the trace's link slowdown), and copies inside one GPU through its HBM (read and
//   write: half of 85% of its bandwidth).
// - Beside the steps, a transfer shares its links with the stages running then (their
//   collectives), except the generation copies after the boundary, which the next step's
//   generation waits for; those run alone. The share the stages take is drawn once per
//   transition, uniform in [0.2, 0.8]: a wide range of "a fifth to four fifths of the
//   links' time", chosen to know little, not fitted to any policy's outcome.
// - Every build's bytes move at its own lognormal jitter (the truth's noise).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "nereus/plan/transition_graph.hpp"
#include "nereus/sim/truth.hpp"

namespace nereus {

namespace {

constexpr double kIntraMessage = 3e-6, kInterMessage = 8e-6;  // as copy_seconds (nccl-tests' sendrecv latencies)
constexpr double kHbmCopyEfficiency = 0.85;                   // streaming copies, as the truth's kHbmEfficiency

/// One build's bytes between two GPUs (src == dst: a copy inside one GPU).
struct Flow {
  std::size_t node = 0;
  std::vector<int> links;  // indices into the link table
  double left = 0;         // bytes still to move
  double scale = 1;        // the build's jitter and, beside the steps, the stages' share
};

/// The link table: capacity in bytes per second of each port.
struct Links {
  std::vector<double> capacity;
  std::map<std::pair<int, int>, int> index;  // (kind, id) → entry
  int of(int kind, int id, double bytes_per_second) {
    const auto [it, fresh] = index.emplace(std::pair{kind, id}, static_cast<int>(capacity.size()));
    if (fresh) capacity.push_back(bytes_per_second);
    return it->second;
  }
};

}  // namespace

TruthTransition GroundTruth::run_transition(const TransitionGraph& g, const JobSpec& job, const TruthTransitionOptions& o) {
  TruthTransition out;
  if (g.nodes.empty()) return out;
  std::map<std::string, bool> trains;
  for (const ModelStage& s : model_stages(job)) trains[s.role] = trains[s.role] || s.kind == StageKind::train;
  const int gpn = std::max(1, cluster_.gpus_per_node);
  const double nvlink = cluster_.intra_node_gbps * 1e9 * intra_efficiency();
  const double nics = cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node * inter_efficiency() / std::max(1.0, o.link_slowdown);
  const double hbm = cluster_.hbm_gbps * 1e9 * kHbmCopyEfficiency / 2;
  enum { port_out, port_in, nic_out, nic_in, hbm_copy };
  std::uniform_real_distribution<double> share(0.2, 0.8);
  const double stages_take = o.beside ? share(rng_) : 0;
  std::lognormal_distribution<double> jitter(0.0, noise_);
  const LinkModel cluster_links = LinkModel::of(cluster_);  // the cluster as plan_build reads it: what moves, not when

  // Per node: when it may start, its setup and its flows.
  const std::size_t n = g.nodes.size();
  std::vector<double> release(n, 0), setup(n, 0), finish(n, 0), start(n, 0);
  std::vector<char> started(n, 0), finished(n, 0);  // times may be negative: before the boundary
  std::vector<std::vector<Flow>> flows(n);
  Links links;
  for (std::size_t k = 0; k < n; ++k) {
    const GraphNode& node = g.nodes[k];
    const std::string& stage = g.stages[node.unit.stage];
    release[k] = o.beside && !trains[stage.substr(0, stage.find('/'))] ? o.early : 0.0;
    if (!node.is_build()) continue;
    std::map<std::pair<int, int>, double> bytes;
    std::map<int, double> messages;  // seconds of setup per GPU
    for (const Transfer& t : plan_build(g, node, cluster_links).plan.transfers()) {
      const int a = static_cast<int>(t.src), b = static_cast<int>(t.dst);
      bytes[{a, b}] += static_cast<double>(t.bytes);
      if (a == b) continue;
      const double m = a / gpn == b / gpn ? kIntraMessage : kInterMessage;
      messages[a] += m;
      messages[b] += m;
    }
    for (const auto& [gpu, s] : messages) setup[k] = std::max(setup[k], s);
    const double scale = jitter(rng_);
    for (const auto& [pair, b] : bytes) {
      Flow f{k, {}, b, scale};
      const auto [a, d] = pair;
      if (a == d) {
        f.links.push_back(links.of(hbm_copy, a, hbm));
      } else if (a / gpn == d / gpn) {
        f.links.push_back(links.of(port_out, a, nvlink));
        f.links.push_back(links.of(port_in, d, nvlink));
      } else {
        f.links.push_back(links.of(nic_out, a / gpn, nics));
        f.links.push_back(links.of(nic_in, d / gpn, nics));
      }
      flows[k].push_back(std::move(f));
    }
  }

  // Event by event: nodes start when their edges and release allow; running flows share
  // their links max-min fairly until one ends.
  std::vector<Flow*> active;
  std::vector<std::size_t> left_flows(n, 0);
  std::vector<double> setup_done(n, std::numeric_limits<double>::infinity());
  double t = *std::min_element(release.begin(), release.end());
  std::size_t done = 0;
  const auto ready = [&](std::size_t k) {
    if (started[k] || release[k] > t) return false;
    for (const Edge& e : g.nodes[k].after)
      if (!finished[e.node]) return false;
    return true;
  };
  while (done < n) {
    for (std::size_t k = 0; k < n; ++k) {
      if (!ready(k)) continue;
      started[k] = 1;
      start[k] = t;
      setup_done[k] = t + setup[k];
      if (flows[k].empty() && setup[k] == 0) {
        finished[k] = 1;
        finish[k] = t;
        ++done;
      }
    }
    for (std::size_t k = 0; k < n; ++k)  // setups that ended: their bytes start to flow
      if (started[k] && !finished[k] && setup_done[k] <= t) {
        setup_done[k] = std::numeric_limits<double>::infinity();
        left_flows[k] = flows[k].size();
        if (left_flows[k] == 0) {
          finished[k] = 1;
          finish[k] = t;
          ++done;
        }
        for (Flow& f : flows[k]) {
          // Generation copies after the boundary run alone; the rest share the links with
          // the stages running beside them.
          const bool alone = !o.beside || (t >= 0 && g.phase[g.nodes[k].unit.stage] == 0);
          f.scale /= alone ? 1.0 : 1.0 - stages_take;
          active.push_back(&f);
        }
      }
    if (done == n) break;
    // Rates: each flow gets the smallest equal share of the links it uses.
    std::vector<int> users(links.capacity.size(), 0);
    for (const Flow* f : active)
      for (int l : f->links) ++users[l];
    double next = std::numeric_limits<double>::infinity();
    std::vector<double> rate(active.size());
    for (std::size_t i = 0; i < active.size(); ++i) {
      double r = std::numeric_limits<double>::infinity();
      for (int l : active[i]->links) r = std::min(r, links.capacity[l] / users[l]);
      rate[i] = r / active[i]->scale;
      next = std::min(next, t + active[i]->left / rate[i]);
    }
    for (std::size_t k = 0; k < n; ++k) {
      if (setup_done[k] > t) next = std::min(next, setup_done[k]);
      if (!started[k] && release[k] > t) next = std::min(next, release[k]);
    }
    if (!std::isfinite(next)) break;  // nothing can move: edges the graph cannot satisfy
    const double dt = next - t;
    for (std::size_t i = 0; i < active.size(); ++i) active[i]->left -= rate[i] * dt;
    t = next;
    std::vector<Flow*> still;
    for (Flow* f : active) {
      if (f->left > 0.5) {  // bytes: what rounding leaves of a finished flow
        still.push_back(f);
        continue;
      }
      if (--left_flows[f->node] == 0) {
        finished[f->node] = 1;
        finish[f->node] = t;
        ++done;
      }
    }
    active = std::move(still);
  }
  double first = std::numeric_limits<double>::infinity(), last = -std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < n; ++k) {
    if (!started[k]) continue;
    first = std::min(first, start[k]);
    last = std::max(last, finish[k]);
    const GraphNode& node = g.nodes[k];
    if (node.is_build() && node.unit.target) {
      const auto [it, first_build] = out.ready.emplace(g.stages[node.unit.stage], finish[k]);
      if (!first_build) it->second = std::max(it->second, finish[k]);  // may be < 0: before the boundary
    }
  }
  out.span = std::isfinite(first) ? std::max(0.0, last - first) : 0;
  return out;
}

}  // namespace nereus
