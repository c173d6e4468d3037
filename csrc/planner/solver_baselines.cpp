// Baseline schedules (none, all, uniform K, sqrt(N)), evaluation of a fixed schedule, and strategy dispatch.
#include <cmath>
#include <stdexcept>
#include <string>

#include "planner/simulate.h"
#include "planner/solver.h"

namespace memsave {
namespace planner {

namespace {

// Appends stages [b, e) as checkpointed segments, keeping stages that cannot be recomputed and starting a new
// segment at a stage that refuses to join its predecessor.
void checkpoint_range(const Chain& chain, int b, int e, Schedule& out) {
  bool open = false;
  for (int i = b; i < e; ++i) {
    const Stage& s = chain.stages[i];
    if (!s.recomputable) {
      out.push_back(Segment{i, i + 1, false});
      open = false;
    } else if (open && s.joins_previous) {
      out.back().end = i + 1;
    } else {
      out.push_back(Segment{i, i + 1, true});
      open = true;
    }
  }
}

}  // namespace

Schedule schedule_none(const Chain& chain) {
  return Schedule{Segment{0, chain.size(), false}};
}

Schedule schedule_all(const Chain& chain) {
  Schedule s;
  for (int i = 0; i < chain.size(); ++i) s.push_back(Segment{i, i + 1, chain.stages[i].recomputable});
  return normalize_schedule(s);
}

Schedule schedule_uniform(const Chain& chain, int k) {
  if (k < 1) throw std::invalid_argument("uniform:K needs K >= 1 segments, got " + std::to_string(k));
  const int L = chain.size();
  k = std::min(k, L);
  Schedule s;
  for (int g = 0; g < k; ++g) {
    const int b = static_cast<int>(static_cast<long long>(g) * L / k);
    const int e = static_cast<int>(static_cast<long long>(g + 1) * L / k);
    if (g + 1 == k) {
      s.push_back(Segment{b, e, false});  // the last group's backward follows at once: recomputing it saves nothing
    } else {
      checkpoint_range(chain, b, e, s);
    }
  }
  return normalize_schedule(s);
}

Schedule schedule_sqrt(const Chain& chain) {
  const int k = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(chain.size())))));
  return schedule_uniform(chain, k);
}

PlanResult plan_schedule(const Chain& chain, std::int64_t budget_bytes, const Schedule& schedule,
                         const std::string& strategy) {
  chain.validate();
  if (budget_bytes < 0) {
    throw std::invalid_argument("budget_bytes is " + std::to_string(budget_bytes) + "; give a budget >= 0 bytes");
  }
  const SimResult sim = simulate(chain, schedule);
  PlanResult r;
  r.strategy = strategy;
  r.chosen_from = strategy;
  r.segments = normalize_schedule(schedule);
  r.budget_bytes = budget_bytes;
  r.predicted_peak_bytes = sim.peak_bytes;
  r.predicted_extra_time = sim.extra_time;
  r.feasible = sim.peak_bytes <= budget_bytes;
  r.eager_time = chain.eager_time();
  r.min_feasible_bytes = min_peak(chain).peak_bytes;
  r.no_checkpoint_peak_bytes = simulate(chain, schedule_none(chain)).peak_bytes;
  return r;
}

PlanResult plan(const Chain& chain, std::int64_t budget_bytes, const std::string& strategy, int slots) {
  if (strategy == "optimal") return plan_optimal(chain, budget_bytes, slots);
  chain.validate();
  if (strategy == "none") return plan_schedule(chain, budget_bytes, schedule_none(chain), strategy);
  if (strategy == "all") return plan_schedule(chain, budget_bytes, schedule_all(chain), strategy);
  if (strategy == "sqrt") return plan_schedule(chain, budget_bytes, schedule_sqrt(chain), strategy);
  if (strategy == "min_memory") return plan_schedule(chain, budget_bytes, min_peak(chain).segments, strategy);
  const std::string prefix = "uniform:";
  if (strategy.compare(0, prefix.size(), prefix) == 0) {
    const std::string num = strategy.substr(prefix.size());
    std::size_t used = 0;
    int k = 0;
    try {
      k = std::stoi(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (num.empty() || used != num.size() || k < 1) {
      throw std::invalid_argument("strategy '" + strategy + "': K must be a whole number >= 1, as in 'uniform:4'");
    }
    return plan_schedule(chain, budget_bytes, schedule_uniform(chain, k), strategy);
  }
  throw std::invalid_argument("unknown strategy '" + strategy +
                              "'; use one of: optimal, sqrt, uniform:K, none, all, min_memory");
}

}  // namespace planner
}  // namespace memsave
