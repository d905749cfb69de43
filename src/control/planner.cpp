#include "nereus/control/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/plan/overlap.hpp"

namespace nereus {

namespace {

/// A point of a Pareto set: time, resident and transient bytes per GPU, GPUs; `a`, `b`
/// point back to what it was merged from.
struct Point {
  double t;
  double r;
  double x;
  int g;
  int a = -1;
  int b = -1;
};

/// The (r, x) points seen so far, as their lower-left staircase: r ascending, x strictly
/// descending. A point is covered when one seen has r' ≤ r and x' ≤ x.
class Staircase {
 public:
  bool covers(double r, double x) const {
    const auto after = std::upper_bound(r_.begin(), r_.end(), r);  // the last r' ≤ r has the least x'
    return after != r_.begin() && x_[static_cast<std::size_t>(after - r_.begin()) - 1] <= x;
  }
  /// Adds a point it does not cover; drops the points the new one covers.
  void add(double r, double x) {
    const auto at = static_cast<std::size_t>(std::lower_bound(r_.begin(), r_.end(), r) - r_.begin());
    std::size_t end = at;
    while (end < x_.size() && x_[end] >= x) ++end;
    r_.erase(r_.begin() + static_cast<std::ptrdiff_t>(at), r_.begin() + static_cast<std::ptrdiff_t>(end));
    x_.erase(x_.begin() + static_cast<std::ptrdiff_t>(at), x_.begin() + static_cast<std::ptrdiff_t>(end));
    r_.insert(r_.begin() + static_cast<std::ptrdiff_t>(at), r);
    x_.insert(x_.begin() + static_cast<std::ptrdiff_t>(at), x);
  }

 private:
  std::vector<double> r_, x_;
};

/// Non-dominated points (by time, then memory and, when `by_gpus`, GPU count). In time
/// order, a point is kept unless one kept before has no more memory (and GPUs): one
/// staircase per GPU count, so a check costs a binary search per smaller count rather
/// than a scan of everything kept (this runs on every replan). Sorts `v` in place.
bool before(const Point& p, const Point& q) {
  if (p.t != q.t) return p.t < q.t;
  if (p.r != q.r) return p.r < q.r;
  if (p.x != q.x) return p.x < q.x;
  return p.g < q.g;
}

/// pareto() of points already in before() order.
std::vector<Point> pareto_sorted(const std::vector<Point>& v, bool by_gpus);

std::vector<Point> pareto(std::vector<Point>& v, bool by_gpus) {
  std::sort(v.begin(), v.end(), before);
  return pareto_sorted(v, by_gpus);
}

std::vector<Point> pareto_sorted(const std::vector<Point>& v, bool by_gpus) {
  std::vector<std::pair<int, Staircase>> seen;  // by GPU count, ascending (one entry without by_gpus)
  std::vector<Point> kept;
  for (const Point& p : v) {
    const int g = by_gpus ? p.g : 0;
    bool dominated = false;
    for (const auto& [count, stairs] : seen) {
      if (count > g) break;
      if ((dominated = stairs.covers(p.r, p.x))) break;
    }
    if (dominated) continue;
    kept.push_back(p);
    auto at = std::lower_bound(seen.begin(), seen.end(), g, [](const auto& e, int c) { return e.first < c; });
    if (at == seen.end() || at->first != g) at = seen.insert(at, {g, Staircase{}});
    at->second.add(p.r, p.x);
  }
  return kept;
}

int granularity_of(const PlannerOptions& o, int gpus, int gpus_per_node) {
  if (o.granularity > 0) return o.granularity;
  return gpus > 64 ? gpus_per_node : 1;
}

/// A stage's memory; in an async job a generation GPU also holds the staged next version
/// of its params while an update is in flight.
StageMemory staged_memory(const CostModel& model, const ModelStage& stage, const Candidate& c, const Workload& w,
                          bool async) {
  StageMemory m = model.memory(stage, c, w);
  if (async && stage.kind == StageKind::generate) m.resident *= 2;
  return m;
}

/// A stage's candidates evaluated, keeping those that fit a GPU on their own.
struct Evaluated {
  std::vector<Candidate> candidates;
  std::vector<Point> points;  ///< parallel to candidates; a = candidate index
};

Evaluated evaluate(const CostModel& model, const ModelStage& stage, int gpus, const Workload& w,
                   const PlannerOptions& o, double budget, bool async) {
  Evaluated e;
  for (const Candidate& c : stage_candidates(stage, gpus, model.cluster(), w.sequences, o)) {
    const StageMemory m = staged_memory(model, stage, c, w, async);
    if (static_cast<double>(m.resident + m.transient) > budget) continue;
    e.points.push_back({model.seconds(stage, c, w), static_cast<double>(m.resident), static_cast<double>(m.transient),
                        c.gpus(), static_cast<int>(e.candidates.size())});
    e.candidates.push_back(c);
  }
  return e;
}

/// A stage's candidates on a pool of `gpus` out of those evaluated on a larger pool with
/// the same granularity: the same list in the same order (a candidate is on a pool when
/// its GPUs fit it), without evaluating them again.
Evaluated within(const Evaluated& all, int gpus) {
  Evaluated e;
  for (std::size_t i = 0; i < all.candidates.size(); ++i)
    if (all.candidates[i].gpus() <= gpus) {
      Point q = all.points[i];
      q.a = static_cast<int>(e.candidates.size());
      e.points.push_back(q);
      e.candidates.push_back(all.candidates[i]);
    }
  return e;
}

}  // namespace

std::vector<Candidate> stage_candidates(const ModelStage& stage, int gpus, const ClusterSpec& cluster,
                                        std::int64_t sequences, const PlannerOptions& o) {
  const ModelConfig& m = stage.model->config();
  const int gpn = cluster.gpus_per_node;
  const int grain = granularity_of(o, gpus, gpn);
  // Expert layouts of a mixture-of-experts model: ep in powers of two, experts whole
  // (etp = 1) or split like attention (etp = tp); a dense model has only ep = 1.
  std::vector<std::pair<int, int>> experts{{1, 0}};
  if (m.moe()) {
    experts.clear();
    for (int ep = 1; ep <= std::min<std::int64_t>(gpus, m.experts); ep *= 2)
      for (int etp : {0, 1}) experts.push_back({ep, etp});
  }
  // An FP8 stage, and the training stage whose weight sync feeds one, split on blocks.
  bool on_blocks = false;
  for (const auto& [name, r] : o.representation)
    on_blocks = on_blocks || (r.fp8 && (name == stage.name() || (stage.kind == StageKind::train && role_of(name) == stage.role)));
  // FSDP degrees: powers of two for a dense model's training stage, when the job uses FSDP.
  std::vector<int> fsdps{1};
  if (o.fsdp && !m.moe() && stage.kind == StageKind::train)
    for (int f = 2; f <= std::min(gpus, 8); f *= 2) fsdps.push_back(f);
  std::vector<Candidate> out;
  for (int tp = 1; tp <= std::min(gpn, gpus); ++tp) {
    if (!valid_tp(m, tp)) continue;
    for (auto [ep, etp] : experts)
      for (int fsdp : fsdps) {
        if (etp == 1 && tp == 1) continue;  // the same as etp = tp
        const Candidate shape{tp, 1, 1, false, ep, etp, fsdp};
        if (!broken_expert_rule(m, shape.layout()).empty()) continue;
        if (on_blocks && cuts_fp8_block(*stage.model, shape.layout())) continue;
        for (int pp = 1; pp <= std::min<std::int64_t>(o.max_pp, m.layers); pp *= 2)
          for (int dp = 1; tp * pp * ep * fsdp * dp <= gpus; ++dp) {
            if (sequences % dp != 0) continue;
            const int g = tp * pp * ep * fsdp * dp;
            if (g > gpn && g % grain != 0) continue;
            for (bool re : {false, true}) {
              if (re && stage.kind != StageKind::train) continue;
              out.push_back({tp, pp, dp, re, ep, etp, fsdp});
            }
          }
      }
  }
  return out;
}

Candidate candidate_of(const CollectionSpec& spec, bool recompute) {
  return {spec.layout.tp, spec.layout.pp, spec.dp, recompute, spec.layout.ep, spec.layout.etp, spec.layout.fsdp};
}

std::map<std::string, Representation> representation_of(const GlobalPlan& plan) {
  std::map<std::string, Representation> out;
  for (const auto& [name, spec] : plan.stages) out[name] = {spec.layout.packing, spec.layout.fp8};
  return out;
}

GlobalPlan place(const JobSpec& job, const std::vector<PlannedStage>& stages,
                 const std::map<std::string, Representation>& representation, int generation_at) {
  std::map<std::string, CollectionSpec> specs;
  for (const auto& phase : job.phases()) {
    std::vector<const PlannedStage*> in;
    for (const ModelStage& s : phase)
      for (const PlannedStage& p : stages)
        if (p.model_stage == s.name()) in.push_back(&p);
    std::stable_sort(in.begin(), in.end(), [](const PlannedStage* a, const PlannedStage* b) {
      return a->candidate.unit() > b->candidate.unit();
    });
    int offset = !phase.empty() && phase.front().kind == StageKind::generate ? generation_at : 0;
    for (const PlannedStage* p : in) {
      CollectionSpec spec;
      spec.layout = p->candidate.layout();
      if (const auto r = representation.find(p->model_stage); r != representation.end()) {
        spec.layout.packing = r->second.packing;
        spec.layout.fp8 = r->second.fp8;
      }
      spec.dp = p->candidate.dp;
      for (int k = 0; k < p->candidate.gpus(); ++k) spec.devices.push_back(offset + k);
      offset += p->candidate.gpus();
      specs[p->model_stage] = spec;
    }
  }
  GlobalPlan plan;
  for (const ModelStage& s : model_stages(job)) plan.stages.emplace_back(s.name(), specs.at(s.name()));
  return plan;
}

namespace {

/// plan_job's search over `phases` (the job's, or an async job's half). With `frontier`,
/// the fast path is skipped and every plan of the final Pareto set (time, resident,
/// transient) is written there, fastest first. With `place_plan` false, choices have no
/// plan (an async half: the caller places both halves together).
PlanChoice solve(const CostModel& model, const JobSpec& job, const std::vector<std::vector<ModelStage>>& phases, int gpus,
                 const Workload& w, const PlannerOptions& o, std::vector<PlanChoice>* frontier, bool place_plan = true,
                 const std::vector<std::vector<Evaluated>>* evaluated = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  if (gpus < 1) throw Error("plan: the pool has no GPUs");
  PlanChoice out;
  const double budget = static_cast<double>(model.budget(o.headroom));
  // Per stage: evaluated candidates and their frontier.
  std::vector<std::vector<Evaluated>> evals(phases.size());
  std::vector<std::vector<std::vector<Point>>> fronts(phases.size());
  for (std::size_t p = 0; p < phases.size(); ++p)
    for (const ModelStage& s : phases[p]) {
      evals[p].push_back(evaluated ? within((*evaluated)[p][evals[p].size()], gpus)
                                   : evaluate(model, s, gpus, w, o, budget, job.async));
      out.candidates += evals[p].back().candidates.size();
      std::vector<Point> points = evals[p].back().points;
      fronts[p].push_back(pareto(points, true));
      out.frontier += fronts[p].back().size();
      if (fronts[p].back().empty()) {
        out.reason = "no layout of " + s.name() + " fits " + std::to_string(gpus) + " GPUs of " +
                     std::to_string(model.cluster().gpu_memory_gib) + " GiB at this sequence length";
        out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return out;
      }
    }
  // Fast path: each phase as fast as its stages can go side by side on the pool, ignoring
  // what the other phases hold; when that combination fits every GPU it is the optimum.
  if (!frontier) {
    std::vector<std::pair<std::size_t, std::size_t>> pick;  // per stage (phase order): front index
    double total = 0, resident = 0, transient = 0;
    bool ok = true;
    for (std::size_t p = 0; p < phases.size() && ok; ++p) {
      // The smallest phase time τ at which the stages' fewest GPUs reaching τ fit the pool.
      std::vector<double> times;
      for (const auto& f : fronts[p])
        for (const Point& q : f) times.push_back(q.t);
      std::sort(times.begin(), times.end());
      times.erase(std::unique(times.begin(), times.end()), times.end());
      auto choose = [&](double tau, std::vector<std::size_t>* out_pick) {
        int g = 0;
        for (const auto& f : fronts[p]) {
          std::size_t best = f.size();
          for (std::size_t i = 0; i < f.size(); ++i)
            if (f[i].t <= tau && (best == f.size() || std::tie(f[i].g, f[i].r, f[i].x) < std::tie(f[best].g, f[best].r, f[best].x)))
              best = i;
          if (best == f.size()) return false;
          g += f[best].g;
          if (out_pick) out_pick->push_back(best);
        }
        return g <= gpus;
      };
      std::size_t lo = 0, hi = times.size();
      while (lo < hi) {
        const std::size_t mid = (lo + hi) / 2;
        if (choose(times[mid], nullptr)) hi = mid;
        else lo = mid + 1;
      }
      if (lo == times.size()) {
        ok = false;
        break;
      }
      std::vector<std::size_t> chosen_idx;
      choose(times[lo], &chosen_idx);
      double pr = 0;
      for (std::size_t k = 0; k < chosen_idx.size(); ++k) {
        const Point& q = fronts[p][k][chosen_idx[k]];
        pr = std::max(pr, q.r);
        transient = std::max(transient, q.x);
        pick.emplace_back(p, chosen_idx[k]);
      }
      resident += pr;
      total += times[lo];
    }
    if (ok && resident + transient <= budget) {
      std::size_t at = 0;
      for (std::size_t p = 0; p < phases.size(); ++p)
        for (std::size_t k = 0; k < phases[p].size(); ++k, ++at) {
          const Point& f = fronts[p][k][pick[at].second];
          const Candidate& cand = evals[p][k].candidates[static_cast<std::size_t>(f.a)];
          out.stages.push_back({phases[p][k].name(), cand, f.t, staged_memory(model, phases[p][k], cand, w, job.async)});
        }
      std::vector<PlannedStage> ordered;
      for (const ModelStage& s : model_stages(job))
        for (const PlannedStage& c : out.stages)
          if (c.model_stage == s.name()) ordered.push_back(c);
      out.stages = std::move(ordered);
      out.feasible = true;
      out.fast_path = true;
      out.step_seconds = total;
      out.peak_memory_bytes = static_cast<std::uint64_t>(resident + transient) + model.overhead_bytes();
      if (place_plan) out.plan = place(job, out.stages, o.representation);
      out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return out;
    }
  }

  // The combinations before pruning, in a buffer kept between calls: thousands of points
  // a replan, freed and allocated again otherwise (heap growth and trimming showed as a
  // sixth of a replan's time).
  thread_local std::vector<Point> scratch;
  // Within a phase: stages side by side. levels[p][k] = Pareto set after k+1 stages.
  std::vector<std::vector<std::vector<Point>>> levels(phases.size());
  std::vector<std::vector<Point>> phase_sets(phases.size());
  for (std::size_t p = 0; p < phases.size(); ++p) {
    std::vector<Point> cur = fronts[p][0];
    for (std::size_t i = 0; i < cur.size(); ++i) cur[i].b = static_cast<int>(i), cur[i].a = -1;
    levels[p].push_back(cur);
    for (std::size_t k = 1; k < fronts[p].size(); ++k) {
      std::vector<Point>& next = scratch;
      next.clear();
      const auto& prev = levels[p].back();
      const auto& front = fronts[p][k];
      auto pair = [&](std::size_t i, std::size_t j) {
        const Point& u = prev[i];
        const Point& v = front[j];
        if (u.g + v.g > gpus || std::max(u.r, v.r) + std::max(u.x, v.x) > budget) return;
        next.push_back({std::max(u.t, v.t), std::max(u.r, v.r), std::max(u.x, v.x), u.g + v.g, static_cast<int>(i),
                        static_cast<int>(j)});
      };
      // Both sets are in time order and a pair takes the later time: pairing each point
      // with the other set's points before it yields the pairs in time order, once each,
      // so only runs of equal time need sorting (no sort of the whole product).
      for (std::size_t i = 0, j = 0; i < prev.size() || j < front.size();) {
        if (j == front.size() || (i < prev.size() && prev[i].t <= front[j].t)) {
          for (std::size_t b = 0; b < j; ++b) pair(i, b);
          ++i;
        } else {
          for (std::size_t a = 0; a < i; ++a) pair(a, j);
          ++j;
        }
      }
      for (std::size_t lo = 0; lo < next.size();) {
        std::size_t hi = lo + 1;
        while (hi < next.size() && next[hi].t == next[lo].t) ++hi;
        if (hi - lo > 1) std::sort(next.begin() + static_cast<std::ptrdiff_t>(lo), next.begin() + static_cast<std::ptrdiff_t>(hi), before);
        lo = hi;
      }
      // GPU counts matter only while stages are still to be added (the pool's limit).
      levels[p].push_back(pareto_sorted(next, k + 1 < fronts[p].size()));
    }
    std::vector<Point> ph = levels[p].back();
    for (std::size_t i = 0; i < ph.size(); ++i) ph[i].a = static_cast<int>(i), ph[i].g = 0;
    phase_sets[p] = pareto(ph, false);
  }
  // Across phases: one after another on the same GPUs.
  std::vector<std::vector<Point>> chain{phase_sets[0]};
  for (std::size_t i = 0; i < chain[0].size(); ++i) chain[0][i].b = static_cast<int>(i), chain[0][i].a = -1;
  for (std::size_t p = 1; p < phases.size(); ++p) {
    std::vector<Point>& next = scratch;
    next.clear();
    for (std::size_t i = 0; i < chain.back().size(); ++i)
      for (std::size_t j = 0; j < phase_sets[p].size(); ++j) {
        const Point& u = chain.back()[i];
        const Point& v = phase_sets[p][j];
        const double r = u.r + v.r, x = std::max(u.x, v.x);
        if (r + x > budget) continue;
        next.push_back({u.t + v.t, r, x, 0, static_cast<int>(i), static_cast<int>(j)});
      }
    chain.push_back(pareto(next, false));
  }
  if (chain.back().empty()) {
    out.reason = "the model-stages fit one by one but not together on " + std::to_string(gpus) + " GPUs";
    out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  // Back from a point of the last chain to each stage's candidate.
  auto choice_of = [&](std::size_t point) {
    PlanChoice c;
    std::vector<PlannedStage> chosen;
    int at = static_cast<int>(point);
    for (std::size_t p = phases.size(); p-- > 0;) {
      const Point& q = chain[p][static_cast<std::size_t>(at)];
      const int in_phase = phase_sets[p][static_cast<std::size_t>(q.b)].a;
      at = q.a;
      int idx = in_phase;
      for (std::size_t k = levels[p].size(); k-- > 0;) {
        const Point& lv = levels[p][k][static_cast<std::size_t>(idx)];
        const Point& f = fronts[p][k][static_cast<std::size_t>(lv.b)];
        const Evaluated& e = evals[p][k];
        const Candidate& cand = e.candidates[static_cast<std::size_t>(f.a)];
        const ModelStage& st = phases[p][k];
        chosen.push_back({st.name(), cand, f.t, staged_memory(model, st, cand, w, job.async)});
        idx = lv.a;
      }
    }
    for (const ModelStage& s : model_stages(job))
      for (const PlannedStage& x : chosen)
        if (x.model_stage == s.name()) c.stages.push_back(x);
    c.feasible = true;
    c.step_seconds = chain.back()[point].t;
    c.peak_memory_bytes = static_cast<std::uint64_t>(chain.back()[point].r + chain.back()[point].x) + model.overhead_bytes();
    if (place_plan) c.plan = place(job, c.stages, o.representation);
    c.candidates = out.candidates;
    c.frontier = out.frontier;
    return c;
  };
  // The fastest.
  std::size_t best = 0;
  for (std::size_t i = 1; i < chain.back().size(); ++i)
    if (chain.back()[i].t < chain.back()[best].t) best = i;
  out = choice_of(best);
  if (frontier) {
    std::vector<std::size_t> by_time(chain.back().size());
    for (std::size_t i = 0; i < by_time.size(); ++i) by_time[i] = i;
    std::stable_sort(by_time.begin(), by_time.end(),
                     [&](std::size_t a, std::size_t b) { return before(chain.back()[a], chain.back()[b]); });
    for (std::size_t i : by_time) frontier->push_back(choice_of(i));
  }
  out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

/// Splits of an async job's pool: G GPUs for generation, powers of two below a node (a
/// node's size is one too, so the other half stays aligned) and whole nodes; above 32
/// nodes, every ⌈nodes/32⌉-th node count (keeps a replan's searches to about 40).
std::vector<int> async_splits(int gpus, int gpn) {
  std::vector<int> out;
  for (int g = 1; g < std::min(gpus, gpn); g *= 2) out.push_back(g);
  const int nodes = gpus / gpn, stride = std::max(1, (nodes + 31) / 32);
  for (int n = 1; n * gpn < gpus; n += (n < 8 ? 1 : stride)) out.push_back(n * gpn);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // Generation sits on the last g GPUs: its blocks start aligned to their size.
  std::erase_if(out, [&](int g) { return (gpus - g) % std::min(g, gpn) != 0; });
  return out;
}

/// Whether every GPU of `plan` is in one node (an update then runs over NVLink).
bool in_one_node(const GlobalPlan& plan, int gpn) {
  const std::vector<DeviceId> d = plan.devices();
  return d.empty() || d.front() / gpn == d.back() / gpn;
}

/// An async step's weight update: the slowest of each generation stage's copy from its
/// role's training stage (the stages' candidates in `stages`).
double update_seconds(const CostModel& model, const JobSpec& job, const std::vector<PlannedStage>& stages, bool inside,
                      const Workload& w) {
  const std::vector<ModelStage> all = model_stages(job);
  auto find = [&](const std::string& name) -> const ModelStage& {
    return *std::find_if(all.begin(), all.end(), [&](const ModelStage& s) { return s.name() == name; });
  };
  double update = 0;
  for (const PlannedStage& g : stages)
    for (const PlannedStage& t : stages) {
      const ModelStage& gs = find(g.model_stage);
      const ModelStage& ts = find(t.model_stage);
      if (gs.kind == StageKind::generate && ts.kind == StageKind::train && gs.role == ts.role)
        update = std::max(update, model.weight_update(gs, g.candidate, t.candidate, inside, w).seconds(model.efficiency()));
    }
  return update;
}

/// plan_job for an async job: each split's halves searched apart (the update's time is
/// added after: it couples the halves only through the generation layout's shard and the
/// training GPUs' count, and is small beside the stages; tests/test_async_control.cpp
/// checks the choice against a brute force over both halves and the update together).
PlanChoice solve_async(const CostModel& model, const JobSpec& job, int gpus, const Workload& w, const PlannerOptions& o,
                       std::vector<PlanChoice>* frontier) {
  const auto t0 = std::chrono::steady_clock::now();
  if (gpus < 1) throw Error("plan: the pool has no GPUs");
  PlanChoice out;
  const auto phases = job.phases();
  if (gpus < 2) {
    out.reason = "an async job runs generation and training on GPUs apart: it needs at least 2, the pool has 1";
    return out;
  }
  const std::vector<std::vector<ModelStage>> generation(phases.begin(), phases.begin() + 1);
  const std::vector<std::vector<ModelStage>> rest(phases.begin() + 1, phases.end());
  const int gpn = model.cluster().gpus_per_node;
  // Every stage's candidates evaluated once, on the whole pool; each half takes those that
  // fit it (where its granularity is the pool's; otherwise it evaluates its own).
  const double budget = static_cast<double>(model.budget(o.headroom));
  std::vector<std::vector<Evaluated>> all(phases.size());
  for (std::size_t p = 0; p < phases.size(); ++p)
    for (const ModelStage& s : phases[p]) all[p].push_back(evaluate(model, s, gpus, w, o, budget, job.async));
  const std::vector<std::vector<Evaluated>> all_generation(all.begin(), all.begin() + 1), all_rest(all.begin() + 1, all.end());
  auto reuse = [&](int half) { return granularity_of(o, half, gpn) == granularity_of(o, gpus, gpn); };
  std::vector<PlanChoice> found;
  std::vector<double> cycle;  // per found: g + r + u, the tie-breaker
  std::size_t candidates = 0, kept = 0;
  std::string reason;
  for (int g : async_splits(gpus, gpn)) {
    PlanChoice a = solve(model, job, generation, g, w, o, nullptr, false, reuse(g) ? &all_generation : nullptr);
    PlanChoice b = solve(model, job, rest, gpus - g, w, o, nullptr, false, reuse(gpus - g) ? &all_rest : nullptr);
    candidates += a.candidates + b.candidates;
    kept += a.frontier + b.frontier;
    if (!a.feasible || !b.feasible) {
      reason = "with " + std::to_string(g) + " of " + std::to_string(gpus) + " GPUs for generation, " +
               (a.feasible ? b.reason : a.reason);
      continue;
    }
    PlanChoice c;
    c.feasible = true;
    c.generation_gpus = g;
    for (const ModelStage& s : model_stages(job))
      for (const PlanChoice* half : {&a, &b})
        for (const PlannedStage& x : half->stages)
          if (x.model_stage == s.name()) c.stages.push_back(x);
    c.plan = place(job, c.stages, o.representation, gpus - g);
    const double u = update_seconds(model, job, c.stages, in_one_node(c.plan, gpn), w);
    c.step_seconds = async_step_seconds(a.step_seconds, b.step_seconds, u, job.max_staleness);
    cycle.push_back(a.step_seconds + b.step_seconds + u);
    c.peak_memory_bytes = std::max(a.peak_memory_bytes, b.peak_memory_bytes);
    found.push_back(std::move(c));
  }
  if (found.empty()) {
    out.reason = "no split of " + std::to_string(gpus) + " GPUs between generation and training fits: " + reason;
    out.candidates = candidates;
    out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  // Fastest first; among equal periods, the shorter cycle through both streams (a stream
  // that waits less leaves room for the other's variation).
  std::vector<std::size_t> order(found.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return std::tie(found[x].step_seconds, cycle[x]) < std::tie(found[y].step_seconds, cycle[y]);
  });
  std::vector<PlanChoice> sorted;
  for (std::size_t i : order) sorted.push_back(std::move(found[i]));
  found = std::move(sorted);
  for (PlanChoice& c : found) c.candidates = candidates, c.frontier = kept;
  out = found.front();
  out.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (frontier) *frontier = std::move(found);
  return out;
}

}  // namespace

double async_step_seconds(double generation, double rest, double update, std::int64_t max_staleness) {
  const double cycle = (generation + rest + update) / static_cast<double>(std::max<std::int64_t>(1, max_staleness) + 1);
  return std::max({generation, rest + update, cycle});
}

PlanChoice plan_job(const CostModel& model, const JobSpec& job, int gpus, const Workload& w, const PlannerOptions& o) {
  if (job.async) return solve_async(model, job, gpus, w, o, nullptr);
  return solve(model, job, job.phases(), gpus, w, o, nullptr);
}

std::vector<PlanChoice> plan_frontier(const CostModel& model, const JobSpec& job, int gpus, const Workload& w,
                                      const PlannerOptions& o) {
  std::vector<PlanChoice> out;
  if (job.async) solve_async(model, job, gpus, w, o, &out);
  else solve(model, job, job.phases(), gpus, w, o, &out);
  return out;
}

PlanChoice plan_job_exhaustive(const CostModel& model, const JobSpec& job, int gpus, const Workload& w,
                               const PlannerOptions& o) {
  const double budget = static_cast<double>(model.budget(o.headroom));
  const auto phases = job.phases();
  std::vector<std::vector<Evaluated>> evals(phases.size());
  for (std::size_t p = 0; p < phases.size(); ++p)
    for (const ModelStage& s : phases[p]) evals[p].push_back(evaluate(model, s, gpus, w, o, budget, job.async));
  // Every combination, phase by phase, with the same rules as plan_job; an async job's
  // under each split, both halves and the update together.
  const std::vector<int> splits = job.async ? async_splits(gpus, model.cluster().gpus_per_node) : std::vector<int>{0};
  std::vector<std::size_t> pick;
  std::vector<std::size_t> best_pick;
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (phase, stage)
  for (std::size_t p = 0; p < phases.size(); ++p)
    for (std::size_t k = 0; k < phases[p].size(); ++k) order.emplace_back(p, k);
  int split = 0;
  std::function<void(std::size_t)> go = [&](std::size_t i) {
    if (i == order.size()) {
      if (!job.async) {
        double t = 0, r = 0, x = 0;
        for (std::size_t p = 0, at = 0; p < phases.size(); ++p) {
          double pt = 0, pr = 0;
          int g = 0;
          for (std::size_t k = 0; k < phases[p].size(); ++k, ++at) {
            const Point& q = evals[p][k].points[pick[at]];
            pt = std::max(pt, q.t), pr = std::max(pr, q.r), x = std::max(x, q.x), g += q.g;
          }
          if (g > gpus) return;
          t += pt, r += pr;
        }
        if (r + x <= budget && t < best) best = t, best_pick = pick;
        return;
      }
      // Async: generation (phase 0) on `split` GPUs, the rest on the others; memory per half.
      double tg = 0, tr = 0, r = 0, x = 0;
      std::vector<PlannedStage> chosen;
      for (std::size_t p = 0, at = 0; p < phases.size(); ++p) {
        double pt = 0, pr = 0;
        int g = 0;
        for (std::size_t k = 0; k < phases[p].size(); ++k, ++at) {
          const Point& q = evals[p][k].points[pick[at]];
          pt = std::max(pt, q.t), pr = std::max(pr, q.r), g += q.g;
          chosen.push_back({phases[p][k].name(), evals[p][k].candidates[pick[at]], q.t, {}});
          if (p > 0) x = std::max(x, q.x);
        }
        if (g > (p == 0 ? split : gpus - split)) return;
        if (p == 0) tg = pt;
        else tr += pt, r += pr;
      }
      if (r + x > budget) return;
      const double t = async_step_seconds(
          tg, tr, update_seconds(model, job, chosen, gpus <= model.cluster().gpus_per_node, w), job.max_staleness);
      if (t < best) best = t, best_pick = pick;
      return;
    }
    const auto [p, k] = order[i];
    for (std::size_t c = 0; c < evals[p][k].points.size(); ++c) {
      pick.push_back(c);
      go(i + 1);
      pick.pop_back();
    }
  };
  for (int g : splits) {
    split = g;
    go(0);
  }
  PlanChoice out;
  if (best_pick.empty()) {
    out.reason = "no combination fits";
    return out;
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto [p, k] = order[i];
    const Candidate& c = evals[p][k].candidates[best_pick[i]];
    out.stages.push_back({phases[p][k].name(), c, evals[p][k].points[best_pick[i]].t, model.memory(phases[p][k], c, w)});
  }
  out.feasible = true;
  out.step_seconds = best;
  return out;
}

namespace {

/// estimate_plan's async step: the generation stream (its stages side by side), the rest
/// on the overlap graph without generation, and the update between them; a GPU shared by
/// a generation and a training stage makes the plan one the async runtime refuses.
void async_estimate(const CostModel& model, const JobSpec& job, const GlobalPlan& plan, const OverlapGraph& og,
                    const Workload& w, PlanEstimate& e) {
  std::vector<double> rest = e.stage_seconds;
  std::vector<PlannedStage> stages;
  const bool inside = in_one_node(plan, model.cluster().gpus_per_node);
  for (std::size_t i = 0; i < og.stages.size(); ++i) {
    const ModelStage& s = og.stages[i];
    const CollectionSpec& spec = *plan.find(s.name());
    stages.push_back({s.name(), candidate_of(spec, e.recompute && s.kind == StageKind::train), e.stage_seconds[i], {}});
    if (s.kind != StageKind::generate) continue;
    e.generation_seconds = std::max(e.generation_seconds, e.stage_seconds[i]);
    rest[i] = 0;
  }
  if (const std::string shared = streams_sharing_gpu(job, plan); !shared.empty())
    e.refusal = shared + ": an async job runs generation and training on GPUs apart";
  e.training_seconds = og.step_seconds(rest);
  e.update_seconds = update_seconds(model, job, stages, inside, w);
  e.step_seconds = async_step_seconds(e.generation_seconds, e.training_seconds, e.update_seconds, job.max_staleness);
}

}  // namespace

PlanEstimate estimate_plan(const CostModel& model, const JobSpec& job, const GlobalPlan& plan, const Workload& w,
                           double headroom) {
  const OverlapGraph og = overlap_graph(job, plan);
  PlanEstimate best;
  // Training stages without recomputation first; with it if that does not fit.
  for (bool re : {false, true}) {
    PlanEstimate e;
    e.recompute = re;
    std::map<DeviceId, std::uint64_t> resident, transient;
    std::map<DeviceId, std::string> working;  // the stage with the largest transient per GPU
    for (const ModelStage& s : og.stages) {
      const CollectionSpec* spec = plan.find(s.name());
      if (!spec) throw Error("estimate: the plan has no layout for '" + s.name() + "'");
      const Candidate c = candidate_of(*spec, re && s.kind == StageKind::train);
      e.stage_seconds.push_back(model.seconds(s, c, w));
      const StageMemory m = staged_memory(model, s, c, w, job.async);
      for (DeviceId d : spec->devices) {
        resident[d] += m.resident;
        if (working[d].empty() || m.transient > transient[d]) working[d] = s.name();
        transient[d] = std::max(transient[d], m.transient);
      }
    }
    e.step_seconds = og.step_seconds(e.stage_seconds);
    if (job.async) async_estimate(model, job, plan, og, w, e);
    for (const auto& [d, r] : resident)
      if (e.peak_device < 0 || r + transient[d] > e.peak_memory_bytes) {
        e.peak_memory_bytes = r + transient[d];
        e.peak_device = d;
        e.peak_stage = working[d];
      }
    e.peak_memory_bytes += model.overhead_bytes();
    e.budget_bytes = model.budget(headroom) + model.overhead_bytes();
    e.fits = e.peak_memory_bytes <= e.budget_bytes && e.refusal.empty();
    if (!re || !best.fits) best = e;
    if (best.fits) break;
  }
  return best;
}

}  // namespace nereus
