// Solvers: the dynamic program against exhaustive search, the guarantee under coarse memory slots, optimal vs the
// baselines, monotonicity in the budget, infeasible budgets, baseline shapes and strategy dispatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "planner/cost_terms.h"
#include "planner/simulate.h"
#include "planner/solver.h"
#include "random_chain.h"

namespace memsave {
namespace planner {
namespace {

using testing_util::for_each_schedule;
using testing_util::random_chain;
using testing_util::RandomChainOptions;

constexpr int kExactSlots = 1 << 22;  // one byte per slot for the small random chains: no rounding at all
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Scored {
  std::int64_t peak;
  double time;
};

std::vector<Scored> score_all(const Chain& c) {
  std::vector<Scored> out;
  for_each_schedule(c, [&](const Schedule& s) {
    const SimResult r = simulate(c, s);  // the reference model, independent of the solver's formula
    out.push_back({r.peak_bytes, r.extra_time});
  });
  return out;
}

double exhaustive_best_time(const std::vector<Scored>& all, std::int64_t budget) {
  double best = kInf;
  for (const Scored& s : all) {
    if (s.peak <= budget) best = std::min(best, s.time);
  }
  return best;
}

// Budgets worth testing: each distinct peak and one byte below it (where the answer changes), thinned to ~max_n.
std::vector<std::int64_t> interesting_budgets(const std::vector<Scored>& all, std::size_t max_n = 40) {
  std::vector<std::int64_t> peaks;
  for (const Scored& s : all) peaks.push_back(s.peak);
  std::sort(peaks.begin(), peaks.end());
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  std::vector<std::int64_t> out;
  const std::size_t step = std::max<std::size_t>(1, peaks.size() / max_n);
  for (std::size_t k = 0; k < peaks.size(); k += step) {
    out.push_back(peaks[k]);
    out.push_back(peaks[k] - 1);
  }
  out.push_back(peaks.back());
  out.push_back(peaks.back() + 1000);
  return out;
}

TEST(Solver, DynamicProgramEqualsExhaustiveSearch) {
  std::mt19937 rng(42);
  int comparisons = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int L = 1 + trial % 10;
    RandomChainOptions opt;
    opt.max_skips = trial % 3 == 0 ? 6 : 3;
    const Chain c = random_chain(rng, L, testing_util::exhaustive_options(L, opt));
    const std::vector<Scored> all = score_all(c);
    for (std::int64_t budget : interesting_budgets(all)) {
      if (budget < 0) continue;
      const double best = exhaustive_best_time(all, budget);
      const DpResult dp = solve_dp(c, budget, kExactSlots);
      ASSERT_EQ(dp.slot_bytes, 1);
      ASSERT_EQ(dp.found, best < kInf) << "trial " << trial << " budget " << budget;
      if (!dp.found) continue;
      EXPECT_EQ(dp.extra_time, best) << "trial " << trial << " L " << L << " budget " << budget;
      EXPECT_LE(simulate(c, dp.segments).peak_bytes, budget);
      EXPECT_EQ(extra_time(c, dp.segments), dp.extra_time);
      const PlanResult p = plan_optimal(c, budget, kExactSlots);
      EXPECT_TRUE(p.feasible);
      EXPECT_EQ(p.predicted_extra_time, best);
      EXPECT_LE(p.predicted_peak_bytes, budget);
      ++comparisons;
    }
  }
  EXPECT_GT(comparisons, 1000);
}

TEST(Solver, MinPeakEqualsExhaustiveSearch) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const int L = 1 + trial % 10;
    const Chain c = random_chain(rng, L, testing_util::exhaustive_options(L));
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    for (const Scored& s : score_all(c)) best = std::min(best, s.peak);
    const MinPeakResult mp = min_peak(c);
    ASSERT_EQ(mp.peak_bytes, best) << "trial " << trial;
    EXPECT_EQ(simulate(c, mp.segments).peak_bytes, best);
  }
}

TEST(Solver, CoarseSlotsNeverBreakTheBudget) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 80; ++trial) {
    const int L = 2 + trial % 9;
    const Chain c = random_chain(rng, L, testing_util::exhaustive_options(L));
    const std::vector<Scored> all = score_all(c);
    const std::int64_t min_feasible = min_peak(c).peak_bytes;
    for (std::int64_t budget : interesting_budgets(all, 15)) {
      if (budget < 0) continue;
      const double best = exhaustive_best_time(all, budget);
      for (int slots : {1, 3, 8, 50}) {
        const DpResult dp = solve_dp(c, budget, slots);
        if (dp.found) {
          EXPECT_LE(simulate(c, dp.segments).peak_bytes, budget) << "slots " << slots;
          EXPECT_GE(dp.extra_time, best);
        }
        const PlanResult p = plan_optimal(c, budget, slots);
        EXPECT_EQ(p.feasible, budget >= min_feasible);
        EXPECT_EQ(p.min_feasible_bytes, min_feasible);
        if (p.feasible) {
          EXPECT_LE(p.predicted_peak_bytes, budget);
          EXPECT_GE(p.predicted_extra_time, best);
        }
      }
    }
  }
}

TEST(Solver, OptimalIsNeverAboveSqrtOrUniformAtEqualBudget) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 2 + trial % 30;
    const Chain c = random_chain(rng, L);
    std::vector<Schedule> baselines = {schedule_sqrt(c), schedule_all(c)};
    for (int k = 1; k <= std::min(L, 8); ++k) baselines.push_back(schedule_uniform(c, k));
    for (const Schedule& b : baselines) {
      const SimResult sb = simulate(c, b);
      for (int slots : {4, 500, kExactSlots}) {
        const PlanResult p = plan_optimal(c, sb.peak_bytes, slots);
        ASSERT_TRUE(p.feasible);
        EXPECT_LE(p.predicted_extra_time, sb.extra_time) << "trial " << trial << " slots " << slots;
      }
      if (L <= 10) {  // the dynamic program alone, without rounding, also beats every baseline
        const DpResult dp = solve_dp(c, sb.peak_bytes, kExactSlots);
        ASSERT_TRUE(dp.found);
        EXPECT_LE(dp.extra_time, sb.extra_time);
      }
    }
  }
}

TEST(Solver, LargerBudgetNeverGivesMoreRecompute) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 2 + trial % 40;
    const Chain c = random_chain(rng, L);
    const std::int64_t lo = min_peak(c).peak_bytes;
    const std::int64_t hi = simulate(c, schedule_none(c)).peak_bytes;
    for (int slots : {4, 37, 500}) {
      double prev_plan = kInf, prev_dp = kInf;
      for (std::int64_t b = lo; b <= hi + 1; b += std::max<std::int64_t>(1, (hi - lo) / 60)) {
        const PlanResult p = plan_optimal(c, b, slots);
        ASSERT_TRUE(p.feasible);
        EXPECT_LE(p.predicted_extra_time, prev_plan) << "trial " << trial << " budget " << b;
        prev_plan = p.predicted_extra_time;
        const DpResult dp = solve_dp(c, b, slots);
        const double t = dp.found ? dp.extra_time : kInf;
        EXPECT_LE(t, prev_dp) << "trial " << trial << " budget " << b;
        prev_dp = t;
      }
    }
  }
}

TEST(Solver, BudgetAtNoCheckpointPeakGivesZeroRecompute) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const Chain c = random_chain(rng, 1 + trial % 20);
    const std::int64_t none_peak = simulate(c, schedule_none(c)).peak_bytes;
    for (std::int64_t b : {none_peak, none_peak + 1, 10 * none_peak + 7}) {
      const PlanResult p = plan_optimal(c, b, 500);
      EXPECT_TRUE(p.feasible);
      EXPECT_EQ(p.predicted_extra_time, 0.0);
      EXPECT_EQ(p.segments, schedule_none(c));
      EXPECT_EQ(p.no_checkpoint_peak_bytes, none_peak);
    }
    EXPECT_EQ(plan_optimal(c, kNoBudget, 500).predicted_extra_time, 0.0);
  }
}

TEST(Solver, InfeasibleBudgetReportsTheMinimum) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 30; ++trial) {
    const Chain c = random_chain(rng, 2 + trial % 10);
    const MinPeakResult mp = min_peak(c);
    for (std::int64_t b : {mp.peak_bytes - 1, std::int64_t{0}}) {
      if (b < 0 || b >= mp.peak_bytes) continue;
      const PlanResult p = plan_optimal(c, b, 500);
      EXPECT_FALSE(p.feasible);
      EXPECT_EQ(p.min_feasible_bytes, mp.peak_bytes);
      EXPECT_EQ(p.predicted_peak_bytes, mp.peak_bytes);  // the closest schedule is returned for reference
      EXPECT_FALSE(solve_dp(c, b, kExactSlots).found);
    }
    const PlanResult at_min = plan_optimal(c, mp.peak_bytes, 1);
    EXPECT_TRUE(at_min.feasible);
    EXPECT_LE(at_min.predicted_peak_bytes, mp.peak_bytes);
  }
}

// A heterogeneous chain: one cheap stage with a huge activation among expensive small ones. sqrt(N) cuts blindly;
// the optimal plan recomputes only what pays.
TEST(Solver, OptimalBeatsSqrtOnAHeterogeneousChain) {
  Chain c;
  const int L = 16;
  for (int i = 0; i < L; ++i) {
    Stage s;
    s.input_bytes = s.input_grad_bytes = (i == 8 ? 400 : 10);
    s.output_bytes = s.output_grad_bytes = (i + 1 == 8 ? 400 : 10);
    s.saved_bytes = (i == 8 ? 800 : 30);
    s.fwd_time = (i == 8 ? 1.0 : 20.0);
    s.bwd_time = 2 * s.fwd_time;
    c.stages.push_back(s);
  }
  const SimResult sq = simulate(c, schedule_sqrt(c));
  const PlanResult opt = plan_optimal(c, sq.peak_bytes, 500);
  ASSERT_TRUE(opt.feasible);
  EXPECT_LT(opt.predicted_extra_time, sq.extra_time);
}

// Transformer-like blocks: most activation bytes come from cheap operators, most forward time from a few expensive
// ones whose outputs are small. Between the whole-checkpoint peak and the eager peak, keeping those outputs and
// recomputing the rest meets the budget at a fraction of whole recompute's time.
TEST(Solver, SelectiveSegmentsWinWhenCheapOperatorsHoldTheBytes) {
  Chain c;
  c.operator_classes = {"matmul"};
  const int L = 8;
  for (int i = 0; i < L; ++i) {
    Stage s;
    s.input_bytes = s.output_bytes = s.input_grad_bytes = s.output_grad_bytes = 10;
    s.saved_bytes = 100;
    s.fwd_time = 10.0;
    s.bwd_time = 20.0;
    s.selective_fwd_time = {2.0};   // the cheap operators: a fifth of the time
    s.selective_kept_bytes = {25};  // the expensive operators' outputs: a quarter of the bytes
    c.stages.push_back(s);
  }
  Chain whole_only = c;
  whole_only.operator_classes.clear();
  for (Stage& s : whole_only.stages) {
    s.selective_fwd_time.clear();
    s.selective_kept_bytes.clear();
  }
  const std::int64_t lo = simulate(c, schedule_all(c)).peak_bytes;
  const std::int64_t hi = simulate(c, schedule_none(c)).peak_bytes;
  const std::int64_t budget = (lo + hi) / 2;
  const PlanResult sel = plan_optimal(c, budget, kExactSlots);
  const PlanResult whole = plan_optimal(whole_only, budget, kExactSlots);
  ASSERT_TRUE(sel.feasible);
  ASSERT_TRUE(whole.feasible);
  EXPECT_LE(sel.predicted_peak_bytes, budget);
  EXPECT_TRUE(has_selective(sel.segments));
  EXPECT_LE(2 * sel.predicted_extra_time, whole.predicted_extra_time);
  EXPECT_EQ(simulate(c, sel.segments).peak_bytes, sel.predicted_peak_bytes);
  // Without operator classes the chain plans exactly as before.
  EXPECT_FALSE(has_selective(whole.segments));
}

TEST(Solver, LongChainWithSkipsStaysWithinBudget) {
  std::mt19937 rng(21);
  RandomChainOptions opt;
  opt.max_skips = 40;
  const Chain c = random_chain(rng, 300, opt);
  const std::int64_t lo = min_peak(c).peak_bytes;
  const std::int64_t hi = simulate(c, schedule_none(c)).peak_bytes;
  for (int f = 0; f <= 4; ++f) {
    const std::int64_t b = lo + (hi - lo) * f / 4;
    const PlanResult p = plan_optimal(c, b, 500);
    ASSERT_TRUE(p.feasible);
    EXPECT_EQ(simulate(c, p.segments).peak_bytes, p.predicted_peak_bytes);
    EXPECT_LE(p.predicted_peak_bytes, b);
  }
}

Chain flat(int L) {
  Chain c;
  for (int i = 0; i < L; ++i) {
    Stage s;
    s.fwd_time = 1.0;
    s.input_bytes = s.output_bytes = s.input_grad_bytes = s.output_grad_bytes = 1;
    s.saved_bytes = 1;
    c.stages.push_back(s);
  }
  return c;
}

TEST(Baselines, UniformSplitsEvenlyAndKeepsTheLastGroup) {
  const Chain c = flat(10);
  const Schedule s = schedule_uniform(c, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (Segment{0, 3, true}));
  EXPECT_EQ(s[1], (Segment{3, 6, true}));
  EXPECT_EQ(s[2], (Segment{6, 10, false}));
  EXPECT_EQ(schedule_uniform(c, 1), schedule_none(c));
  EXPECT_EQ(schedule_uniform(c, 50).size(), 10u);  // clamped to L groups
  EXPECT_THROW(schedule_uniform(c, 0), std::invalid_argument);
}

TEST(Baselines, SqrtUsesAboutSqrtLGroups) {
  const Schedule s = schedule_sqrt(flat(16));
  ASSERT_EQ(s.size(), 4u);
  for (const Segment& seg : s) EXPECT_EQ(seg.end - seg.begin, 4);
  EXPECT_EQ(schedule_sqrt(flat(1)), schedule_none(flat(1)));
}

TEST(Baselines, AllAndFlags) {
  Chain c = flat(5);
  c.stages[2].recomputable = false;
  const Schedule all = schedule_all(c);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_FALSE(all[2].recompute);
  EXPECT_TRUE(all[4].recompute);
  c.stages[3].joins_previous = false;
  c.stages[2].recomputable = true;
  const Schedule u = schedule_uniform(c, 2);  // groups [0,2) and [2,5)
  EXPECT_EQ(u.front(), (Segment{0, 2, true}));
  c.stages[1].joins_previous = false;
  const Schedule u2 = schedule_uniform(c, 2);
  ASSERT_GE(u2.size(), 3u);
  EXPECT_EQ(u2[0], (Segment{0, 1, true}));
  EXPECT_EQ(u2[1], (Segment{1, 2, true}));
}

TEST(Dispatch, StrategiesAndErrors) {
  const Chain c = flat(9);
  for (const char* s : {"optimal", "sqrt", "uniform:3", "none", "all", "min_memory"}) {
    const PlanResult p = plan(c, kNoBudget, s, 100);
    EXPECT_EQ(p.strategy, s);
    EXPECT_TRUE(p.feasible);
    EXPECT_NO_THROW(validate_schedule(c, p.segments));
  }
  EXPECT_EQ(plan(c, kNoBudget, "uniform:3", 100).segments, schedule_uniform(c, 3));
  EXPECT_FALSE(plan(c, 0, "none", 100).feasible);
  EXPECT_THROW(plan(c, 100, "uniform:0", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, 100, "uniform:x", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, 100, "uniform:", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, 100, "fastest", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, -1, "optimal", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, -1, "sqrt", 100), std::invalid_argument);
  EXPECT_THROW(plan(c, 100, "optimal", 0), std::invalid_argument);
  EXPECT_THROW(plan(Chain{}, 100, "optimal", 10), std::invalid_argument);
}

TEST(Dispatch, TooManySlotsIsAClearError) {
  Chain c = flat(9);
  for (Stage& s : c.stages) s.input_bytes = s.output_bytes = s.input_grad_bytes = s.output_grad_bytes = 1LL << 40;
  EXPECT_THROW(solve_dp(c, 1LL << 50, 1 << 30), std::invalid_argument);
  EXPECT_NO_THROW(solve_dp(c, 1LL << 50, 5000));
}

}  // namespace
}  // namespace planner
}  // namespace memsave
