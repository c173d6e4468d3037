// Checkpoint planners for a chain: an optimal dynamic program under a memory budget, the exact smallest peak, and
// the usual baselines (none, all, uniform K, sqrt(N)).
//
// Optimal solver. A schedule is a partition of the stages into kept stages and checkpointed segments. By the
// decomposition in cost_terms.h, a schedule's peak is max_c (held(c) + peak_offset(c)) where held grows by
// held_delta(c) from one segment to the next. The dynamic program runs over (first stage i of the rest of the
// chain, held bytes m):
//     T(L, m) = 0
//     T(i, m) = min over c starting at i with m + peak_offset(c) <= budget of  cost(c) + T(end(c), m + held_delta(c))
// where c ranges over the runs of kept stages [i, e) (a run is one transition, so its held bytes are rounded once, not
// once per stage), the checkpointed segments [i, e) recomputed whole, and, for each operator-class set k of the chain
// (Chain::operator_classes), the selective segments [i, e) keeping set k (a third kind of transition: checkpointed
// segments over the stages' selective variants, which keep their expensive operators' outputs and recompute only the
// rest). Held bytes are counted in slots of q = ceil(sum of all kept held_delta / slots) bytes, each held_delta rounded
// UP to whole slots, so a state's slot count times q is never below the true held bytes and a schedule accepted by the
// program always satisfies the exact constraint: rounding can make the program miss a schedule, never accept one that
// breaks the budget (the loss is at most one slot per segment of the schedule). q depends on the chain and `slots`
// only, not on the budget, so a larger budget only loosens every constraint and never increases the optimum. With S
// slots the program has O(L * (S + L)) states and O(L^2 * (S + L)) transitions (each (i, c) pair is a tight loop over
// m); memory O(L * (S + L)) for the choices; P operator-class sets multiply the checkpointed transitions by P + 1. With
// slots >= the total held bytes, q = 1 and the program is exact.
//
// plan_optimal() returns the best (least recompute, then lowest peak) schedule that fits among the program's answer,
// the exact minimum-peak schedule and every baseline (uniform K for all K, none, all), all checked with simulate():
// so it is never worse than a baseline even when rounding costs the program a schedule, and its recompute is
// monotone non-increasing in the budget.
//
// Minimum peak: P(L) = -inf, P(i) = min over c starting at i of max(peak_offset(c), held_delta(c) + P(end(c))),
// exact in bytes, O(L^2 + L * skips). P(0) is the smallest budget any schedule fits in.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "planner/chain.h"

namespace memsave {
namespace planner {

constexpr std::int64_t kNoBudget = std::numeric_limits<std::int64_t>::max();

struct PlanResult {
  std::string strategy;     // as requested: optimal, sqrt, uniform:K, none, all, min_memory
  std::string chosen_from;  // which candidate produced the schedule (e.g. "dp", "uniform:3", "min_peak")
  Schedule segments;        // normalized: consecutive kept stages merged
  bool feasible = false;    // predicted_peak_bytes <= budget_bytes
  std::int64_t budget_bytes = kNoBudget;
  std::int64_t predicted_peak_bytes = 0;  // simulate() of the schedule
  double predicted_extra_time = 0.0;      // recompute time of the schedule
  double eager_time = 0.0;                // sum of fwd_time + bwd_time
  std::int64_t min_feasible_bytes = 0;    // smallest peak over all schedules
  std::int64_t no_checkpoint_peak_bytes = 0;
  int slots = 0;                // memory slots of the dynamic program (optimal only)
  std::int64_t slot_bytes = 0;  // bytes per slot (optimal only)
};

struct MinPeakResult {
  Schedule segments;
  std::int64_t peak_bytes = 0;
  double extra_time = 0.0;  // among the minimum-peak choices at each step the cheaper one is preferred
};

struct DpResult {
  bool found = false;
  Schedule segments;
  double extra_time = 0.0;
  std::int64_t slot_bytes = 0;
};

// Exact smallest predicted peak over all schedules, and a schedule achieving it.
MinPeakResult min_peak(const Chain& chain);

// The dynamic program alone (no baselines): least recompute time with predicted peak <= budget_bytes, memory in
// `slots` slots. found == false when no schedule fits after rounding.
DpResult solve_dp(const Chain& chain, std::int64_t budget_bytes, int slots);

// Baseline schedules. Stages that cannot be recomputed stay kept; a stage that refuses to join its predecessor
// starts a new checkpointed segment.
Schedule schedule_none(const Chain& chain);
Schedule schedule_all(const Chain& chain);  // every stage its own checkpointed segment
// K groups of (almost) equal stage count; all but the last are checkpointed, like
// torch.utils.checkpoint.checkpoint_sequential. K is clamped to [1, L]; K < 1 throws std::invalid_argument.
Schedule schedule_uniform(const Chain& chain, int k);
// Chen et al.'s sqrt(N): uniform with K = round(sqrt(L)) groups of about sqrt(L) stages.
Schedule schedule_sqrt(const Chain& chain);

// The solvers. budget_bytes < 0 throws std::invalid_argument; kNoBudget means "no budget" (feasible always true).
// Example: PlanResult p = plan(chain, 4LL << 30, "optimal", 500);
PlanResult plan_optimal(const Chain& chain, std::int64_t budget_bytes, int slots = 500);
PlanResult plan_schedule(const Chain& chain, std::int64_t budget_bytes, const Schedule& schedule,
                         const std::string& strategy);

// Dispatch on a strategy name: "optimal", "sqrt", "uniform:K", "none", "all", "min_memory" (the minimum-peak
// schedule). Throws std::invalid_argument for an unknown name, a bad K or slots < 1.
PlanResult plan(const Chain& chain, std::int64_t budget_bytes, const std::string& strategy, int slots = 500);

}  // namespace planner
}  // namespace memsave
