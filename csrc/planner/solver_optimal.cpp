// The optimal planner: exact minimum peak and the budgeted dynamic program (see solver.h for the recurrences).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner/cost_terms.h"
#include "planner/simulate.h"
#include "planner/solver.h"

namespace memsave {
namespace planner {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kKeep = -1;

void check_args(const Chain& chain, std::int64_t budget_bytes, int slots) {
  chain.validate();
  if (budget_bytes < 0) {
    throw std::invalid_argument("budget_bytes is " + std::to_string(budget_bytes) + "; give a budget >= 0 bytes");
  }
  if (slots < 1) {
    throw std::invalid_argument("slots is " + std::to_string(slots) + "; the memory discretisation needs >= 1 slot");
  }
}

// Peak of a schedule from precomputed terms (the formula of cost_terms.h).
std::int64_t peak_from_terms(const CostTerms& terms, const Schedule& schedule) {
  std::int64_t held = 0, peak = std::numeric_limits<std::int64_t>::min();
  for (const Segment& seg : schedule) {
    if (seg.recompute) {
      const SegmentTerms t = terms.checkpointed(seg.begin, seg.end, seg.kept_classes);
      peak = std::max(peak, held + t.peak_offset);
      held += t.held_delta;
    } else {
      for (int i = seg.begin; i < seg.end; ++i) {
        peak = std::max(peak, held + terms.kept(i).peak_offset);
        held += terms.kept(i).held_delta;
      }
    }
  }
  return peak;
}

// Bytes per memory slot: the most any schedule can hold (every stage kept), split into `slots`, rounded up.
std::int64_t slot_size(const CostTerms& terms, int slots) {
  std::int64_t total_held = 0;
  for (int i = 0; i < terms.chain().size(); ++i) total_held += terms.kept(i).held_delta;
  return std::max<std::int64_t>(1, (total_held + slots - 1) / slots);
}

}  // namespace

MinPeakResult min_peak(const Chain& chain) {
  chain.validate();
  const int L = chain.size();
  const CostTerms terms(chain);
  // best[i]: smallest peak of stages i.. with nothing held before them; ties broken by recompute time.
  std::vector<std::int64_t> best(L + 1, 0);
  std::vector<double> time(L + 1, 0.0);
  std::vector<int> choice(L, kKeep);
  std::vector<int> choice_kept_classes(L, -1);
  auto value = [&](const SegmentTerms& t, int next) {
    return next == L ? t.peak_offset : std::max(t.peak_offset, t.held_delta + best[next]);
  };
  for (int i = L - 1; i >= 0; --i) {
    best[i] = value(terms.kept(i), i + 1);
    time[i] = time[i + 1];
    choice[i] = kKeep;
    for (int kept_classes = -1; kept_classes < terms.num_operator_classes(); ++kept_classes) {
      terms.for_each_checkpointed(
          i,
          [&](int end, const SegmentTerms& t) {
            const std::int64_t v = value(t, end);
            const double tt = t.cost + time[end];
            if (v < best[i] || (v == best[i] && tt < time[i])) {
              best[i] = v;
              time[i] = tt;
              choice[i] = end;
              choice_kept_classes[i] = kept_classes;
            }
            return true;
          },
          kept_classes);
    }
  }
  MinPeakResult r;
  for (int i = 0; i < L;) {
    if (choice[i] == kKeep) {
      r.segments.push_back(Segment{i, i + 1, false});
      ++i;
    } else {
      r.segments.push_back(Segment{i, choice[i], true, choice_kept_classes[i]});
      i = choice[i];
    }
  }
  r.segments = normalize_schedule(r.segments);
  r.peak_bytes = best[0];
  r.extra_time = time[0];
  return r;
}

DpResult solve_dp(const Chain& chain, std::int64_t budget_bytes, int slots) {
  check_args(chain, budget_bytes, slots);
  const int L = chain.size();
  const CostTerms terms(chain);

  const std::int64_t q = slot_size(terms, slots);
  auto to_slots = [q](std::int64_t bytes) { return (bytes + q - 1) / q; };
  // No schedule holds more slots than the sum over stages i of the most that a segment starting at i holds.
  std::int64_t max_slots = 0;
  for (int i = 0; i < L; ++i) {
    std::int64_t most = to_slots(terms.kept(i).held_delta);
    for (int kept_classes = -1; kept_classes < terms.num_operator_classes(); ++kept_classes) {
      terms.for_each_checkpointed(
          i,
          [&](int, const SegmentTerms& t) {
            most = std::max(most, to_slots(t.held_delta));
            return true;
          },
          kept_classes);
    }
    max_slots += most;
  }
  const std::int64_t width64 = std::min(max_slots, budget_bytes / q) + 1;
  constexpr std::int64_t kMaxTableEntries = std::int64_t{1} << 26;  // ~0.8 GB of costs and choices
  if (width64 * (L + 1) > kMaxTableEntries) {
    throw std::invalid_argument("slots = " + std::to_string(slots) + " would need a table of " +
                                std::to_string(width64 * (L + 1)) + " entries for " + std::to_string(L) +
                                " stages; use fewer slots (a few thousand are plenty)");
  }
  const int W = static_cast<int>(width64);

  std::vector<double> T(static_cast<std::size_t>(L + 1) * W, kInf);
  std::vector<int> choice(static_cast<std::size_t>(L) * W, 0);
  std::fill(T.begin() + static_cast<std::ptrdiff_t>(L) * W, T.end(), 0.0);

  auto relax = [&](int i, const SegmentTerms& t, int next, int code) {
    if (t.peak_offset > budget_bytes) return;
    const std::int64_t m_max = std::min<std::int64_t>((budget_bytes - t.peak_offset) / q, W - 1);
    const std::int64_t d = to_slots(t.held_delta);
    double* Ti = &T[static_cast<std::size_t>(i) * W];
    int* Ci = &choice[static_cast<std::size_t>(i) * W];
    const double* Tn = &T[static_cast<std::size_t>(next) * W];
    // States whose successor is still inside the table.
    const std::int64_t m_in = std::min<std::int64_t>(m_max, W - 1 - d);
    for (std::int64_t m = 0; m <= m_in; ++m) {
      const double cand = t.cost + Tn[m + d];
      if (cand < Ti[m]) {
        Ti[m] = cand;
        Ci[m] = code;
      }
    }
    // Successors beyond the table hold more than the budget: only the end of the chain accepts them.
    if (next == L) {
      for (std::int64_t m = std::max<std::int64_t>(m_in + 1, 0); m <= m_max; ++m) {
        if (t.cost < Ti[m]) {
          Ti[m] = t.cost;
          Ci[m] = code;
        }
      }
    }
  };

  // Choice codes: -end for a run of kept stages [i, end), (kept_classes + 1) * (L + 1) + end > 0 for a checkpointed
  // segment [i, end) (kept_classes -1: whole, k >= 0: selective). A kept run is one transition so that its held
  // bytes are rounded up once, not once per stage.
  for (int i = L - 1; i >= 0; --i) {
    terms.for_each_kept_run(i, [&](int end, const SegmentTerms& t) {
      relax(i, t, end, -end);
      return t.peak_offset <= budget_bytes;  // a kept run's offset only grows with its end
    });
    for (int kept_classes = -1; kept_classes < terms.num_operator_classes(); ++kept_classes) {
      terms.for_each_checkpointed(
          i,
          [&](int end, const SegmentTerms& t) {
            relax(i, t, end, (kept_classes + 1) * (L + 1) + end);
            return true;
          },
          kept_classes);
    }
  }

  DpResult r;
  r.slot_bytes = q;
  if (!(T[0] < kInf)) return r;
  r.found = true;
  r.extra_time = T[0];
  std::int64_t m = 0;
  for (int i = 0; i < L;) {
    const int c = choice[static_cast<std::size_t>(i) * W + m];
    if (c < 0) {
      std::int64_t held = 0;
      for (int k = i; k < -c; ++k) held += terms.kept(k).held_delta;
      r.segments.push_back(Segment{i, -c, false});
      m += to_slots(held);
      i = -c;
    } else {
      const int end = c % (L + 1), kept_classes = c / (L + 1) - 1;
      r.segments.push_back(Segment{i, end, true, kept_classes});
      m += to_slots(terms.checkpointed(i, end, kept_classes).held_delta);
      i = end;
    }
    if (m >= W) m = W - 1;  // only reachable when i == L (see relax)
  }
  r.segments = normalize_schedule(r.segments);
  return r;
}

PlanResult plan_optimal(const Chain& chain, std::int64_t budget_bytes, int slots) {
  check_args(chain, budget_bytes, slots);
  const int L = chain.size();
  const CostTerms terms(chain);
  const MinPeakResult mp = min_peak(chain);
  const Schedule none = schedule_none(chain);
  const std::int64_t none_peak = peak_from_terms(terms, none);

  struct Candidate {
    Schedule schedule;
    std::string source;
  };
  Candidate chosen;
  if (budget_bytes < mp.peak_bytes) {
    chosen = {mp.segments, "min_peak"};
  } else if (none_peak <= budget_bytes) {
    chosen = {none, "none"};
  } else {
    std::vector<Candidate> cands;
    const DpResult dp = solve_dp(chain, budget_bytes, slots);
    if (dp.found) cands.push_back({dp.segments, "dp"});
    cands.push_back({mp.segments, "min_peak"});
    cands.push_back({schedule_all(chain), "all"});
    for (int k = 2; k <= L; ++k) cands.push_back({schedule_uniform(chain, k), "uniform:" + std::to_string(k)});
    double best_time = kInf;
    std::int64_t best_peak = 0;
    for (const Candidate& c : cands) {
      const std::int64_t pk = peak_from_terms(terms, c.schedule);
      if (pk > budget_bytes) continue;
      const double t = extra_time(chain, c.schedule);
      if (t < best_time || (t == best_time && pk < best_peak)) {
        best_time = t;
        best_peak = pk;
        chosen = c;
      }
    }
    // The minimum-peak schedule fits (budget >= its peak), so something was chosen.
  }

  PlanResult r = plan_schedule(chain, budget_bytes, chosen.schedule, "optimal");
  r.chosen_from = chosen.source;
  r.slots = slots;
  r.slot_bytes = slot_size(terms, slots);
  if (budget_bytes >= mp.peak_bytes && !r.feasible) {
    throw std::logic_error("planner: chosen schedule exceeds the budget; the cost model and simulator disagree");
  }
  return r;
}

}  // namespace planner
}  // namespace memsave
