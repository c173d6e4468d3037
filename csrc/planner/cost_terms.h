// The simulator's peak, decomposed per segment so that a dynamic program can use it.
//
// Walk a schedule's segments c_1, c_2, ... in order and let held(c) be the bytes that the segments before c keep
// from the end of their forward until the backward reaches them again (their input boundaries, the saved bytes of
// kept stages, the skips they produce that outlive them). Every moment of simulate() that happens while segment c
// runs forward, recomputes or runs backward has live bytes = held(c) + a term that depends only on c itself and on
// chain constants (gradients of later boundaries and skips, parameter gradients of later stages). Hence
//
//     peak(schedule) = max over segments c of ( held(c) + peak_offset(c) ),
//     held(c_{k+1}) = held(c_k) + held_delta(c_k)
//
// with peak_offset and held_delta computed below; moments between segments are never higher. evaluate_peak() applies
// this formula; the tests check it against simulate() on every schedule of many random chains.
//
// A selective segment keeping operator-class set k is a checkpointed segment of selective_chain(chain, k) (simulate()
// runs it the same way, on materialize()): CostTerms keeps one CostTerms of that chain per set and hands its
// checkpointed terms out for kept_classes k, so the formula below exists once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "planner/chain.h"

namespace memsave {
namespace planner {

struct SegmentTerms {
  std::int64_t peak_offset = 0;  // highest moment of the segment minus held(c); includes chain.base_bytes
  std::int64_t held_delta = 0;   // what the segment adds to held() for the segments after it
  double cost = 0.0;             // recompute time (0 for a kept stage)
};

class CostTerms {
 public:
  // `chain` must outlive this object and must have been validated.
  explicit CostTerms(const Chain& chain);

  // A kept stage i (a kept segment of several stages has the terms of its stages one after the other).
  const SegmentTerms& kept(int i) const { return kept_[i]; }

  // Calls fn(end, terms) for every run of kept stages [begin, end), end = begin+1, ..., L, as one segment: its
  // peak_offset is the highest of its stages' moments above the held bytes at its start, its held_delta the sum of
  // its stages'. fn returns false to stop early. O(L - begin).
  template <typename Fn>
  void for_each_kept_run(int begin, Fn&& fn) const;

  // Calls fn(end, terms) for every checkpointed segment [begin, end) with end = begin+1, begin+2, ..., stopping at
  // the first stage that cannot be recomputed or cannot join its predecessor (or, for kept_classes k >= 0, has no
  // selective variant k). fn returns false to stop early. O(L - begin + number of skips) in all.
  template <typename Fn>
  void for_each_checkpointed(int begin, Fn&& fn, int kept_classes = -1) const;

  // Terms of one checkpointed segment [begin, end) (selective with kept_classes k >= 0); throws
  // std::invalid_argument if it is not allowed.
  SegmentTerms checkpointed(int begin, int end, int kept_classes = -1) const;

  const Chain& chain() const { return chain_; }
  int num_operator_classes() const { return static_cast<int>(selective_.size()); }

 private:
  template <typename Fn>
  void for_each_whole(int begin, Fn&& fn) const;

  const Chain& chain_;
  int L_;
  std::vector<std::unique_ptr<const Chain>> selective_chains_;  // selective_chain(chain, k)
  std::vector<std::unique_ptr<const CostTerms>> selective_;     // their terms
  std::vector<std::int64_t> A_, T_, G_;  // boundary bytes (kept, passing) and gradient bytes, 0..L
  std::vector<std::int64_t> born_;       // skip bytes produced by stage i
  std::vector<std::int64_t> bwd_const_;  // backward of stage j minus held, segment-independent part
  std::vector<std::int64_t> rec_const_;  // recompute of a segment ending at e (inclusive), gradient part
  std::vector<std::vector<int>> by_consumer_;
  std::vector<SegmentTerms> kept_;
};

// peak(schedule) by the decomposition above. Equal to simulate(chain, schedule).peak_bytes.
std::int64_t evaluate_peak(const Chain& chain, const Schedule& schedule);

// ---- template implementation ----

template <typename Fn>
void CostTerms::for_each_kept_run(int b, Fn&& fn) const {
  SegmentTerms t;
  t.peak_offset = INT64_MIN;
  for (int i = b; i < L_; ++i) {
    t.peak_offset = std::max(t.peak_offset, t.held_delta + kept_[i].peak_offset);
    t.held_delta += kept_[i].held_delta;
    if (!fn(i + 1, static_cast<const SegmentTerms&>(t))) return;
  }
}

template <typename Fn>
void CostTerms::for_each_checkpointed(int b, Fn&& fn, int kept_classes) const {
  if (kept_classes < 0) {
    for_each_whole(b, fn);
  } else {
    selective_.at(static_cast<std::size_t>(kept_classes))->for_each_whole(b, fn);
  }
}

template <typename Fn>
void CostTerms::for_each_whole(int b, Fn&& fn) const {
  const Chain& c = chain_;
  const std::int64_t base = c.base_bytes + A_[b] + T_[b];
  std::int64_t sfwd = 0;  // skips produced in [b, j] still to be read at stage >= j
  std::int64_t srec = 0;  // skips produced in [b, j]
  std::int64_t esc = 0;   // skips produced in [b, e] read after e
  std::int64_t cum = 0;   // sum over k in [b, j) of saved_k + A_{k+1}
  std::int64_t kept = 0;  // sum over k in [b, j] of checkpoint_kept_bytes (held until stage k is recomputed)
  // rec_inner_max: the highest recompute moment minus the kept bytes still held then (those of the segment's
  // stages after it, so it is found once the segment's end is known: + kept).
  std::int64_t fwd_max = INT64_MIN, rec_inner_max = INT64_MIN, bwd_max = INT64_MIN;
  std::int64_t overhead = c.segment_bytes;  // held by the segment during all of its moments
  double cost = 0.0;
  for (int j = b; j < L_; ++j) {
    const Stage& s = c.stages[j];
    if (!s.recomputable || (j > b && !s.joins_previous)) return;
    if (j > b) {
      for (int k : by_consumer_[j - 1]) {
        if (c.skips[k].producer >= b) sfwd -= c.skips[k].bytes;
      }
    }
    for (int k : by_consumer_[j]) {
      if (c.skips[k].producer >= b) esc -= c.skips[k].bytes;
    }
    sfwd += born_[j];
    srec += born_[j];
    esc += born_[j];
    const std::int64_t in = j > b ? A_[j] + T_[j] : 0;  // the segment's own input is in `base`
    kept += s.checkpoint_kept_bytes;
    const std::int64_t fwd = in + A_[j + 1] + T_[j + 1] + s.fwd_transient_bytes + sfwd + kept;
    const std::int64_t rec =
        cum + s.saved_bytes + A_[j + 1] + T_[j + 1] + (j > b ? T_[j] : 0) + srec + s.fwd_transient_bytes - kept;
    cum += s.saved_bytes + A_[j + 1];
    const std::int64_t bwd = cum + srec + bwd_const_[j];
    fwd_max = std::max(fwd_max, fwd);
    rec_inner_max = std::max(rec_inner_max, rec);
    bwd_max = std::max(bwd_max, bwd);
    cost += s.fwd_time;
    overhead += s.checkpoint_bytes;
    SegmentTerms t;
    // The recompute moments also hold a second copy of the checkpoint state (overhead - segment_bytes) and
    // recompute_bytes.
    const std::int64_t rec_state = c.recompute_bytes + overhead - c.segment_bytes;
    t.peak_offset =
        base + overhead + std::max(fwd_max, std::max(rec_const_[j] + rec_state + rec_inner_max + kept, bwd_max));
    t.held_delta = A_[b] + T_[b] + esc + overhead + kept;
    t.cost = cost - s.tail_time;  // a segment ending here is recomputed up to this stage's tail
    if (!fn(j + 1, static_cast<const SegmentTerms&>(t))) return;
  }
}

}  // namespace planner
}  // namespace memsave
