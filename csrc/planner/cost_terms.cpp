#include "planner/cost_terms.h"

#include <stdexcept>
#include <string>

namespace memsave {
namespace planner {

CostTerms::CostTerms(const Chain& chain) : chain_(chain), L_(chain.size()) {
  const int L = L_;
  A_.resize(L + 1);
  T_.resize(L + 1);
  G_.resize(L + 1);
  for (int j = 0; j <= L; ++j) {
    A_[j] = chain.boundary_bytes(j);
    T_[j] = chain.boundary_passing_bytes(j);
    G_[j] = chain.boundary_grad_bytes(j);
  }
  born_.assign(L, 0);
  by_consumer_.assign(L, {});
  // Skip gradients live from the consumer's backward to the producer's backward: during the backward of stage j
  // when producer <= j <= consumer, during the recompute before the backward of e when producer <= e < consumer.
  std::vector<std::int64_t> sg_bwd(L, 0), sg_rec(L, 0);
  for (int k = 0; k < static_cast<int>(chain.skips.size()); ++k) {
    const Skip& sk = chain.skips[k];
    born_[sk.producer] += sk.bytes;
    by_consumer_[sk.consumer].push_back(k);
    for (int j = sk.producer; j <= sk.consumer; ++j) sg_bwd[j] += sk.grad_bytes;
    for (int j = sk.producer; j < sk.consumer; ++j) sg_rec[j] += sk.grad_bytes;
  }
  // Parameter gradients of stages after j, allocated before the backward reaches j.
  std::vector<std::int64_t> p_after(L, 0);
  for (int j = L - 2; j >= 0; --j) p_after[j] = p_after[j + 1] + chain.stages[j + 1].param_grad_bytes;

  bwd_const_.resize(L);
  rec_const_.resize(L);
  kept_.resize(L);
  for (int j = 0; j < L; ++j) {
    const Stage& s = chain.stages[j];
    bwd_const_[j] = G_[j + 1] + p_after[j] + sg_bwd[j] + G_[j] + s.bwd_transient_bytes + s.param_grad_bytes;
    rec_const_[j] = G_[j + 1] + p_after[j] + sg_rec[j];
    const std::int64_t held_in_stage = chain.base_bytes + A_[j] + s.saved_bytes + A_[j + 1] + born_[j];
    // Forward also holds both passing parts (input and output); backward neither.
    kept_[j].peak_offset = held_in_stage + std::max(T_[j] + T_[j + 1] + s.fwd_transient_bytes, bwd_const_[j]);
    kept_[j].held_delta = A_[j] + s.saved_bytes + born_[j];
    kept_[j].cost = 0.0;
  }
  for (int k = 0; k < chain.num_operator_classes(); ++k) {
    selective_chains_.push_back(std::make_unique<const Chain>(selective_chain(chain, k)));
    selective_.push_back(std::make_unique<const CostTerms>(*selective_chains_.back()));
  }
}

SegmentTerms CostTerms::checkpointed(int begin, int end, int kept_classes) const {
  SegmentTerms found;
  bool ok = false;
  if (begin >= 0 && end > begin && end <= L_ && kept_classes >= -1 && kept_classes < num_operator_classes()) {
    for_each_checkpointed(
        begin,
        [&](int e, const SegmentTerms& t) {
          if (e == end) {
            found = t;
            ok = true;
            return false;
          }
          return true;
        },
        kept_classes);
  }
  if (!ok) {
    throw std::invalid_argument(
        "stages [" + std::to_string(begin) + ", " + std::to_string(end) + ") cannot form one checkpointed segment" +
        (kept_classes >= 0 ? " keeping operator-class set " + std::to_string(kept_classes) : std::string()));
  }
  return found;
}

std::int64_t evaluate_peak(const Chain& chain, const Schedule& schedule) {
  chain.validate();
  validate_schedule(chain, schedule);
  const CostTerms terms(chain);
  std::int64_t held = 0, peak = INT64_MIN;
  auto visit = [&](const SegmentTerms& t) {
    peak = std::max(peak, held + t.peak_offset);
    held += t.held_delta;
  };
  for (const Segment& seg : schedule) {
    if (seg.recompute) {
      visit(terms.checkpointed(seg.begin, seg.end, seg.kept_classes));
    } else {
      for (int i = seg.begin; i < seg.end; ++i) visit(terms.kept(i));
    }
  }
  return peak;
}

}  // namespace planner
}  // namespace memsave
