// Random chains (with operator-class sets and selective variants) and exhaustive schedule enumeration for the planner
// tests.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "planner/chain.h"

namespace memsave {
namespace planner {
namespace testing_util {

struct RandomChainOptions {
  int max_bytes = 40;
  int max_skips = 3;
  double not_recomputable_p = 0.1;
  double no_join_p = 0.1;
  int max_class_sets = 2;      // operator-class sets: 0..max_class_sets of them
  double no_variant_p = 0.15;  // a stage without selective variants
};

// Small integer sizes and integer times, so that sums are exact and ties are real ties. Exhaustive searches over
// long chains should lower max_class_sets (the number of schedules grows as (P + 3)^L).
inline Chain random_chain(std::mt19937& rng, int L, const RandomChainOptions& o = {}) {
  auto bytes = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  Chain c;
  c.base_bytes = bytes(10);
  c.segment_bytes = coin(0.5) ? 0 : bytes(8);
  c.recompute_bytes = coin(0.5) ? 0 : bytes(8);
  const int n_sets = std::uniform_int_distribution<int>(0, o.max_class_sets)(rng);
  for (int k = 0; k < n_sets; ++k) c.operator_classes.push_back("class" + std::to_string(k));
  std::vector<std::int64_t> A(L + 1), T(L + 1), G(L + 1);
  for (int j = 0; j <= L; ++j) {
    A[j] = bytes(o.max_bytes);
    T[j] = coin(0.5) ? 0 : bytes(o.max_bytes);
    G[j] = coin(0.2) ? 0 : A[j] + T[j];  // some boundaries do not require grad
  }
  for (int i = 0; i < L; ++i) {
    Stage s;
    s.name = "s" + std::to_string(i);
    s.fwd_time = std::uniform_int_distribution<int>(0, 10)(rng);
    s.bwd_time = std::uniform_int_distribution<int>(0, 20)(rng);
    s.input_bytes = A[i];
    s.output_bytes = A[i + 1];
    s.input_passing_bytes = T[i];
    s.output_passing_bytes = T[i + 1];
    s.input_grad_bytes = G[i];
    s.output_grad_bytes = G[i + 1];
    s.saved_bytes = bytes(2 * o.max_bytes);
    s.fwd_transient_bytes = bytes(o.max_bytes);
    s.bwd_transient_bytes = bytes(o.max_bytes);
    s.param_grad_bytes = bytes(o.max_bytes / 2);
    s.checkpoint_bytes = coin(0.5) ? 0 : bytes(6);
    s.checkpoint_kept_bytes = coin(0.7) ? 0 : bytes(6);
    const bool tails = coin(0.5);  // a recompute ending in this stage may stop before its forward's end
    auto tail_of = [&](double fwd) {
      return tails ? std::uniform_int_distribution<int>(0, static_cast<int>(fwd))(rng) : 0;
    };
    s.tail_time = tail_of(s.fwd_time);
    if (n_sets > 0 && !coin(o.no_variant_p)) {
      for (int k = 0; k < n_sets; ++k) {
        s.selective_fwd_time.push_back(std::uniform_int_distribution<int>(0, static_cast<int>(s.fwd_time))(rng));
        s.selective_kept_bytes.push_back(bytes(o.max_bytes));
        if (tails) s.selective_tail_time.push_back(tail_of(s.selective_fwd_time.back()));
      }
    }
    s.recomputable = !coin(o.not_recomputable_p);
    s.joins_previous = !coin(o.no_join_p);
    c.stages.push_back(s);
  }
  if (L >= 2) {
    const int n = std::uniform_int_distribution<int>(0, o.max_skips)(rng);
    for (int k = 0; k < n; ++k) {
      Skip sk;
      sk.producer = std::uniform_int_distribution<int>(0, L - 2)(rng);
      sk.consumer = std::uniform_int_distribution<int>(sk.producer + 1, L - 1)(rng);
      sk.bytes = bytes(o.max_bytes);
      sk.grad_bytes = coin(0.3) ? 0 : sk.bytes;
      c.skips.push_back(sk);
    }
  }
  return c;
}

// Options for chains whose schedules are all enumerated: fewer operator-class sets on longer chains, so that
// (P + 3)^L stays in the tens of thousands.
inline RandomChainOptions exhaustive_options(int L, RandomChainOptions o = {}) {
  o.max_class_sets = L <= 6 ? 2 : (L <= 8 ? 1 : 0);
  return o;
}

// Calls fn(schedule) for every partition of the stages into segments, each kept, checkpointed whole or selective
// keeping one of the P operator-class sets, that the chain's flags and variants allow: (P + 2) * (P + 3)^(L-1)
// schedules before filtering.
inline void for_each_schedule(const Chain& chain, const std::function<void(const Schedule&)>& fn) {
  const int L = chain.size();
  Schedule cur;
  std::function<void(int)> rec = [&](int b) {
    if (b == L) {
      fn(cur);
      return;
    }
    for (int e = b + 1; e <= L; ++e) {
      cur.push_back(Segment{b, e, false});
      rec(e);
      cur.pop_back();
      bool ok = true;
      for (int i = b; i < e && ok; ++i) {
        ok = chain.stages[i].recomputable && (i == b || chain.stages[i].joins_previous);
      }
      if (!ok) continue;
      for (int kept_classes = -1; kept_classes < chain.num_operator_classes(); ++kept_classes) {
        bool has = true;
        for (int i = b; i < e && has && kept_classes >= 0; ++i) has = chain.has_variant(i, kept_classes);
        if (!has) continue;
        cur.push_back(Segment{b, e, true, kept_classes});
        rec(e);
        cur.pop_back();
      }
    }
  };
  rec(0);
}

}  // namespace testing_util
}  // namespace planner
}  // namespace memsave
