#include "planner/simulate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace memsave {
namespace planner {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackwardStart:
      return "backward_start";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kBackward:
      return "backward";
  }
  return "unknown";
}

namespace {

// Buffers of one step, each identified by (kind, index). Allocating a live buffer or freeing a dead one is a bug in
// the simulator itself, reported as std::logic_error.
enum Kind {
  kBase,
  kAct,
  kActCopy,
  kPass,
  kPassCopy,
  kSaved,
  kGrad,
  kParamGrad,
  kSkipAct,
  kSkipActCopy,
  kSkipGrad,
  kSegment,
  kRecompute,
  kKeptOut,
  kNumKinds
};

class Memory {
 public:
  Memory(int n_index) : n_(n_index), bytes_(static_cast<std::size_t>(kNumKinds) * n_index, -1) {}

  void alloc(Kind k, int i, std::int64_t b) {
    std::int64_t& slot = bytes_[static_cast<std::size_t>(k) * n_ + i];
    if (slot >= 0) throw std::logic_error("simulator: buffer allocated twice (" + label(k, i) + ")");
    slot = b;
    live_ += b;
  }
  void free(Kind k, int i) {
    std::int64_t& slot = bytes_[static_cast<std::size_t>(k) * n_ + i];
    if (slot < 0) throw std::logic_error("simulator: buffer freed while not live (" + label(k, i) + ")");
    live_ -= slot;
    slot = -1;
  }
  std::int64_t live() const { return live_; }

 private:
  static std::string label(Kind k, int i) { return "kind " + std::to_string(k) + " index " + std::to_string(i); }
  int n_;
  std::vector<std::int64_t> bytes_;
  std::int64_t live_ = 0;
};

}  // namespace

SimResult simulate(const Chain& given, const Schedule& schedule, bool keep_timeline) {
  given.validate();
  validate_schedule(given, schedule);
  // Selective segments are checkpointed segments over their stages' variants: one set of rules for both.
  const Chain materialized = has_selective(schedule) ? materialize(given, schedule) : Chain();
  const Chain& chain = has_selective(schedule) ? materialized : given;
  const int L = chain.size();
  const StageAssignment a = assign_stages(chain, schedule);
  const int n_skips = static_cast<int>(chain.skips.size());

  std::vector<std::vector<int>> produced(L), consumed(L);
  for (int k = 0; k < n_skips; ++k) {
    produced[chain.skips[k].producer].push_back(k);
    consumed[chain.skips[k].consumer].push_back(k);
  }
  auto same_checkpointed_segment = [&](int p, int q) {
    return a.recompute[p] && a.recompute[q] && a.segment_begin[p] == a.segment_begin[q];
  };

  Memory mem(std::max(L + 1, n_skips));
  SimResult r;
  r.peak_bytes = -1;
  auto moment = [&](Phase ph, int stage, std::int64_t transient) {
    const std::int64_t v = mem.live() + transient;
    if (v > r.peak_bytes) {
      r.peak_bytes = v;
      r.peak_phase = ph;
      r.peak_stage = stage;
    }
    if (keep_timeline) r.timeline.push_back(Moment{ph, stage, v});
  };

  // Forward.
  mem.alloc(kBase, 0, chain.base_bytes);
  mem.alloc(kAct, 0, chain.boundary_bytes(0));
  mem.alloc(kPass, 0, chain.boundary_passing_bytes(0));
  for (int i = 0; i < L; ++i) {
    const Stage& s = chain.stages[i];
    if (a.recompute[i] && a.segment_begin[i] == i) {
      std::int64_t overhead = chain.segment_bytes;
      for (int j = i; j < a.segment_end[i]; ++j) overhead += chain.stages[j].checkpoint_bytes;
      mem.alloc(kSegment, i, overhead);
    }
    mem.alloc(kAct, i + 1, chain.boundary_bytes(i + 1));
    mem.alloc(kPass, i + 1, chain.boundary_passing_bytes(i + 1));
    for (int k : produced[i]) mem.alloc(kSkipAct, k, chain.skips[k].bytes);
    if (!a.recompute[i]) mem.alloc(kSaved, i, s.saved_bytes);
    if (a.recompute[i]) mem.alloc(kKeptOut, i, s.checkpoint_kept_bytes);
    moment(Phase::kForward, i, s.fwd_transient_bytes);
    if (!a.recompute[i]) mem.free(kPass, i);
    if (a.recompute[i]) {
      if (i > a.segment_begin[i]) {
        mem.free(kAct, i);
        mem.free(kPass, i);
      }
      for (int k : consumed[i]) {
        if (same_checkpointed_segment(chain.skips[k].producer, i)) mem.free(kSkipAct, k);
      }
    }
  }

  mem.free(kPass, L);  // nothing in the chain reads the passing part of its output after the last forward

  // Backward.
  mem.alloc(kGrad, L, chain.boundary_grad_bytes(L));
  moment(Phase::kBackwardStart, L, 0);
  if (a.recompute[L - 1]) mem.free(kAct, L);
  for (int i = L - 1; i >= 0; --i) {
    const Stage& s = chain.stages[i];
    if (a.recompute[i] && a.segment_end[i] == i + 1) {
      const int b = a.segment_begin[i];
      for (int p = b; p <= i; ++p) {
        for (int k : produced[p]) {
          if (chain.skips[k].consumer > i) mem.free(kSkipAct, k);
        }
      }
      std::int64_t rec_state = chain.recompute_bytes;
      for (int j = b; j <= i; ++j) rec_state += chain.stages[j].checkpoint_bytes;
      mem.alloc(kRecompute, b, rec_state);
      for (int j = b; j <= i; ++j) {
        mem.free(kKeptOut, j);  // the recompute reads them back: from here on they are part of the saved bytes
        mem.alloc(kSaved, j, chain.stages[j].saved_bytes);
        mem.alloc(kActCopy, j + 1, chain.boundary_bytes(j + 1));
        mem.alloc(kPassCopy, j + 1, chain.boundary_passing_bytes(j + 1));
        for (int k : produced[j]) mem.alloc(kSkipActCopy, k, chain.skips[k].bytes);
        moment(Phase::kRecompute, j, chain.stages[j].fwd_transient_bytes);
        if (j > b) mem.free(kPassCopy, j);
      }
      mem.free(kPassCopy, i + 1);
      mem.free(kRecompute, b);
    }
    for (int k : consumed[i]) mem.alloc(kSkipGrad, k, chain.skips[k].grad_bytes);
    mem.alloc(kGrad, i, chain.boundary_grad_bytes(i));
    mem.alloc(kParamGrad, i, s.param_grad_bytes);
    moment(Phase::kBackward, i, s.bwd_transient_bytes);
    mem.free(kSaved, i);
    mem.free(kGrad, i + 1);
    mem.free(a.recompute[i] ? kActCopy : kAct, i + 1);
    if (i >= 1 && a.recompute[i - 1] && a.segment_end[i - 1] == i) mem.free(kAct, i);
    for (int k : produced[i]) {
      mem.free(a.recompute[i] ? kSkipActCopy : kSkipAct, k);
      mem.free(kSkipGrad, k);
    }
    if (a.recompute[i] && a.segment_begin[i] == i) {
      mem.free(kPass, i);
      mem.free(kSegment, i);
    }
  }

  r.end_bytes = mem.live();
  std::int64_t expected_end = chain.base_bytes + chain.boundary_bytes(0) + chain.boundary_grad_bytes(0);
  for (const Stage& s : chain.stages) expected_end += s.param_grad_bytes;
  if (r.end_bytes != expected_end) {
    throw std::logic_error("simulator: " + std::to_string(r.end_bytes) + " bytes live after the step, expected " +
                           std::to_string(expected_end));
  }
  r.extra_time = extra_time(given, schedule);
  return r;
}

}  // namespace planner
}  // namespace memsave
