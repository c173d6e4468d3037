// Random chains and exhaustive schedule enumeration for the planner tests.
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
};

// Small integer sizes and integer times, so that sums are exact and ties are real ties.
inline Chain random_chain(std::mt19937& rng, int L, const RandomChainOptions& o = {}) {
  auto bytes = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  Chain c;
  c.base_bytes = bytes(10);
  c.segment_bytes = coin(0.5) ? 0 : bytes(8);
  c.recompute_bytes = coin(0.5) ? 0 : bytes(8);
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

// Calls fn(schedule) for every partition of the stages into segments, each kept or checkpointed, that the chain's
// flags allow: 2 * 3^(L-1) schedules before filtering.
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
      if (ok) {
        cur.push_back(Segment{b, e, true});
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
