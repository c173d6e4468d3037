// Planner speed: time of the optimal solver for chains of L = 10..1000 stages at 500 (and 2000) memory slots, without
// and with 3 operator-class sets (a selective variant per set and stage: the third kind of segment, which multiplies
// the checkpointed transitions).
// Not a test. Build with tests/cpp (target memsave_planner_speed), run from the repository root:
//   ./build/cpp/tests/cpp/memsave_planner_speed [output.json]     (default benchmarks/results/planner_speed.json)
// Each chain is heterogeneous (sizes in MB and times in ms drawn from fixed seeds, a skip connection every ~8
// stages) and the budget sits halfway between the smallest feasible peak and the no-checkpoint peak, where the
// dynamic program has the most to do. Reported times are medians over repeated runs, in milliseconds, single thread;
// extra_time_ratio (predicted recompute / eager compute) shows what finer memory slots buy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "planner/simulate.h"
#include "planner/solver.h"

using namespace memsave::planner;

namespace {

Chain make_chain(int L, unsigned seed, int class_sets) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mb(1, 64);
  std::uniform_real_distribution<double> ms(0.2, 5.0);
  const std::int64_t MB = 1 << 20;
  Chain c;
  c.base_bytes = 16 * MB;
  std::vector<std::int64_t> A(L + 1);
  for (auto& a : A) a = mb(rng) * MB;
  for (int i = 0; i < L; ++i) {
    Stage s;
    s.name = "block" + std::to_string(i);
    s.fwd_time = ms(rng);
    s.bwd_time = 2 * s.fwd_time;
    s.input_bytes = s.input_grad_bytes = A[i];
    s.output_bytes = s.output_grad_bytes = A[i + 1];
    s.saved_bytes = 3 * mb(rng) * MB;
    s.fwd_transient_bytes = mb(rng) * MB / 2;
    s.bwd_transient_bytes = mb(rng) * MB;
    s.param_grad_bytes = mb(rng) * MB / 8;
    for (int k = 0; k < class_sets; ++k) {  // keeping more operators' outputs: less recompute, more bytes held
      s.selective_fwd_time.push_back(s.fwd_time * (0.8 - 0.25 * k));
      s.selective_kept_bytes.push_back(s.saved_bytes * (k + 1) / 6);
    }
    c.stages.push_back(s);
  }
  for (int p = 0; p + 8 < L; p += 8) c.skips.push_back(Skip{p, p + 7, A[p + 1], A[p + 1]});
  for (int k = 0; k < class_sets; ++k) c.operator_classes.push_back("class" + std::to_string(k));
  return c;
}

template <typename Fn>
double median_ms(Fn&& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "benchmarks/results/planner_speed.json";
  const std::vector<int> lengths = {10, 20, 50, 100, 200, 300, 500, 700, 1000};
  std::string rows;
  std::printf("%6s %6s %10s %12s %12s %12s %10s %10s\n", "L", "slots", "class_sets", "dp_ms", "optimal_ms",
              "min_peak_ms", "segments", "overhead");
  for (int class_sets : {0, 3})
    for (int slots : {500, 2000})
      for (int L : lengths) {
        const Chain c = make_chain(L, 1000u + L, class_sets);
        const std::int64_t lo = min_peak(c).peak_bytes;
        const std::int64_t hi = simulate(c, schedule_none(c)).peak_bytes;
        const std::int64_t budget = lo + (hi - lo) / 2;
        const int reps = L <= 100 ? 21 : (L <= 300 ? 5 : 3);
        DpResult dp;
        PlanResult p;
        const double dp_ms = median_ms([&] { dp = solve_dp(c, budget, slots); }, reps);
        const double plan_ms = median_ms([&] { p = plan_optimal(c, budget, slots); }, reps);
        const double mp_ms = median_ms([&] { (void)min_peak(c); }, reps);
        std::printf("%6d %6d %10d %12.3f %12.3f %12.3f %10zu %10.4f\n", L, slots, class_sets, dp_ms, plan_ms, mp_ms,
                    p.segments.size(), p.predicted_extra_time / p.eager_time);
        char buf[640];
        std::snprintf(buf, sizeof buf,
                      "    {\"L\": %d, \"slots\": %d, \"class_sets\": %d, \"dp_ms\": %.4f, \"optimal_ms\": %.4f, "
                      "\"min_peak_ms\": %.4f, "
                      "\"budget_bytes\": %lld, \"min_feasible_bytes\": %lld, \"no_checkpoint_peak_bytes\": %lld, "
                      "\"predicted_peak_bytes\": %lld, \"extra_time_ratio\": %.4f, \"chosen_from\": \"%s\"}",
                      L, slots, class_sets, dp_ms, plan_ms, mp_ms, static_cast<long long>(budget),
                      static_cast<long long>(lo), static_cast<long long>(hi),
                      static_cast<long long>(p.predicted_peak_bytes), p.predicted_extra_time / p.eager_time,
                      p.chosen_from.c_str());
        if (!rows.empty()) rows += ",\n";
        rows += buf;
      }
  std::ofstream f(out);
  if (!f) {
    std::fprintf(stderr, "cannot write %s; run from the repository root or pass an output path\n", out.c_str());
    return 1;
  }
  f << "{\n  \"benchmark\": \"planner_speed\",\n"
    << "  \"description\": \"median wall time of solve_dp (the dynamic program), plan_optimal (dynamic program + "
       "exact minimum peak + baseline candidates, what memsave.plan calls) and min_peak, budget halfway between "
       "the smallest feasible and the no-checkpoint peak; class_sets: operator-class sets, a selective variant each "
       "per stage (0: whole segments only, as before)\",\n"
    << "  \"compiler\": \""
    <<
#if defined(__clang__)
      "clang " __clang_version__
#elif defined(__GNUC__)
      "gcc " __VERSION__
#else
      "unknown"
#endif
    << "\",\n  \"results\": [\n"
    << rows << "\n  ]\n}\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
