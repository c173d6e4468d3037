#include "planner/chain.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace memsave {
namespace planner {

namespace {

std::string stage_label(const Chain& chain, int i) {
  std::ostringstream os;
  os << "stage " << i;
  if (!chain.stages[i].name.empty()) os << " ('" << chain.stages[i].name << "')";
  return os.str();
}

void check_bytes(const Chain& chain, int i, const char* field, std::int64_t v) {
  if (v < 0) {
    std::ostringstream os;
    os << stage_label(chain, i) << ": " << field << " is " << v << "; byte counts must be >= 0";
    throw std::invalid_argument(os.str());
  }
}

void check_time(const Chain& chain, int i, const char* field, double v) {
  if (!std::isfinite(v) || v < 0.0) {
    std::ostringstream os;
    os << stage_label(chain, i) << ": " << field << " is " << v << "; times must be finite and >= 0";
    throw std::invalid_argument(os.str());
  }
}

// A tail is part of the forward it ends: at most that forward's time.
void check_tail(const Chain& chain, int i, const char* field, double tail, double fwd) {
  check_time(chain, i, field, tail);
  if (tail > fwd) {
    std::ostringstream os;
    os << stage_label(chain, i) << ": " << field << " is " << tail << ", more than the forward time " << fwd
       << " it is part of";
    throw std::invalid_argument(os.str());
  }
}

void check_variants(const Chain& chain, int i) {
  const Stage& s = chain.stages[i];
  const std::size_t nv = s.selective_fwd_time.size();
  if (nv != s.selective_kept_bytes.size() || (nv != 0 && nv != chain.operator_classes.size()) ||
      (!s.selective_tail_time.empty() && s.selective_tail_time.size() != nv)) {
    std::ostringstream os;
    os << stage_label(chain, i) << " has " << nv << " selective_fwd_time, " << s.selective_kept_bytes.size()
       << " selective_kept_bytes and " << s.selective_tail_time.size()
       << " selective_tail_time entries; give none, or one of each per operator_classes entry ("
       << chain.operator_classes.size() << "; selective_tail_time may be left empty)";
    throw std::invalid_argument(os.str());
  }
  for (std::size_t k = 0; k < nv; ++k) {
    check_time(chain, i, "selective_fwd_time", s.selective_fwd_time[k]);
    check_bytes(chain, i, "selective_kept_bytes", s.selective_kept_bytes[k]);
    if (!s.selective_tail_time.empty()) {
      check_tail(chain, i, "selective_tail_time", s.selective_tail_time[k], s.selective_fwd_time[k]);
    }
  }
}

}  // namespace

void Chain::validate() const {
  if (stages.empty()) throw std::invalid_argument("the chain has no stages; give at least one stage");
  if (base_bytes < 0) throw std::invalid_argument("base_bytes must be >= 0");
  if (segment_bytes < 0) throw std::invalid_argument("segment_bytes must be >= 0");
  if (recompute_bytes < 0) throw std::invalid_argument("recompute_bytes must be >= 0");
  const int L = size();
  for (int i = 0; i < L; ++i) {
    const Stage& s = stages[i];
    check_time(*this, i, "fwd_time", s.fwd_time);
    check_time(*this, i, "bwd_time", s.bwd_time);
    check_bytes(*this, i, "input_bytes", s.input_bytes);
    check_bytes(*this, i, "output_bytes", s.output_bytes);
    check_bytes(*this, i, "input_passing_bytes", s.input_passing_bytes);
    check_bytes(*this, i, "output_passing_bytes", s.output_passing_bytes);
    check_bytes(*this, i, "input_grad_bytes", s.input_grad_bytes);
    check_bytes(*this, i, "output_grad_bytes", s.output_grad_bytes);
    check_bytes(*this, i, "saved_bytes", s.saved_bytes);
    check_bytes(*this, i, "fwd_transient_bytes", s.fwd_transient_bytes);
    check_bytes(*this, i, "bwd_transient_bytes", s.bwd_transient_bytes);
    check_bytes(*this, i, "param_grad_bytes", s.param_grad_bytes);
    check_bytes(*this, i, "checkpoint_bytes", s.checkpoint_bytes);
    check_bytes(*this, i, "checkpoint_kept_bytes", s.checkpoint_kept_bytes);
    check_tail(*this, i, "tail_time", s.tail_time, s.fwd_time);
    check_variants(*this, i);
    if (i + 1 < L) {
      const Stage& n = stages[i + 1];
      if (s.output_bytes != n.input_bytes || s.output_grad_bytes != n.input_grad_bytes ||
          s.output_passing_bytes != n.input_passing_bytes) {
        std::ostringstream os;
        os << stage_label(*this, i) << " writes a boundary of " << s.output_bytes << " bytes (passing "
           << s.output_passing_bytes << ", gradient " << s.output_grad_bytes << ") but " << stage_label(*this, i + 1)
           << " reads " << n.input_bytes << " bytes (passing " << n.input_passing_bytes << ", gradient "
           << n.input_grad_bytes << "); neighbouring stages share one boundary, so these must be equal";
        throw std::invalid_argument(os.str());
      }
    }
  }
  for (std::size_t k = 0; k < skips.size(); ++k) {
    const Skip& sk = skips[k];
    if (sk.producer < 0 || sk.consumer >= L || sk.producer >= sk.consumer) {
      std::ostringstream os;
      os << "skip " << k << ": producer " << sk.producer << " and consumer " << sk.consumer
         << " must satisfy 0 <= producer < consumer < " << L;
      throw std::invalid_argument(os.str());
    }
    if (sk.bytes < 0 || sk.grad_bytes < 0) {
      std::ostringstream os;
      os << "skip " << k << ": bytes and grad_bytes must be >= 0";
      throw std::invalid_argument(os.str());
    }
  }
}

std::int64_t Chain::boundary_bytes(int j) const {
  return j < size() ? stages[j].input_bytes : stages[j - 1].output_bytes;
}

std::int64_t Chain::boundary_passing_bytes(int j) const {
  return j < size() ? stages[j].input_passing_bytes : stages[j - 1].output_passing_bytes;
}

std::int64_t Chain::boundary_grad_bytes(int j) const {
  return j < size() ? stages[j].input_grad_bytes : stages[j - 1].output_grad_bytes;
}

double Chain::eager_time() const {
  double t = 0.0;
  for (const Stage& s : stages) t += s.fwd_time + s.bwd_time;
  return t;
}

void validate_schedule(const Chain& chain, const Schedule& schedule) {
  const int L = chain.size();
  int next = 0;
  for (std::size_t k = 0; k < schedule.size(); ++k) {
    const Segment& seg = schedule[k];
    if (seg.begin != next || seg.end <= seg.begin || seg.end > L) {
      std::ostringstream os;
      os << "schedule segment " << k << " is [" << seg.begin << ", " << seg.end << ") but the next segment must "
         << "start at stage " << next << ", be non-empty and end at most at " << L;
      throw std::invalid_argument(os.str());
    }
    if (seg.kept_classes != -1) {
      if (!seg.recompute || seg.kept_classes < 0 || seg.kept_classes >= chain.num_operator_classes()) {
        throw std::invalid_argument(
            "schedule segment " + std::to_string(k) + " has kept_classes " + std::to_string(seg.kept_classes) +
            "; a selective segment is checkpointed and keeps one of the chain's " +
            std::to_string(chain.num_operator_classes()) + " operator_classes entries (-1: none)");
      }
      for (int i = seg.begin; i < seg.end; ++i) {
        if (!chain.has_variant(i, seg.kept_classes)) {
          throw std::invalid_argument("schedule segment " + std::to_string(k) + " recomputes " + stage_label(chain, i) +
                                      " selectively, but it has no selective variant");
        }
      }
    }
    if (seg.recompute) {
      for (int i = seg.begin; i < seg.end; ++i) {
        if (!chain.stages[i].recomputable) {
          throw std::invalid_argument("schedule segment " + std::to_string(k) + " recomputes " + stage_label(chain, i) +
                                      ", which is marked not recomputable");
        }
        if (i > seg.begin && !chain.stages[i].joins_previous) {
          throw std::invalid_argument("schedule segment " + std::to_string(k) + " puts " + stage_label(chain, i) +
                                      " in one checkpointed segment with the stage before it, which it refuses "
                                      "(joins_previous is false)");
        }
      }
    }
    next = seg.end;
  }
  if (next != L) {
    throw std::invalid_argument("schedule covers stages 0.." + std::to_string(next) + " but the chain has " +
                                std::to_string(L) + " stages");
  }
}

Schedule normalize_schedule(const Schedule& schedule) {
  Schedule out;
  for (const Segment& seg : schedule) {
    if (!seg.recompute && !out.empty() && !out.back().recompute && out.back().end == seg.begin) {
      out.back().end = seg.end;
    } else {
      out.push_back(seg);
    }
  }
  return out;
}

StageAssignment assign_stages(const Chain& chain, const Schedule& schedule) {
  const int L = chain.size();
  StageAssignment a;
  a.recompute.assign(L, false);
  a.segment_begin.assign(L, 0);
  a.segment_end.assign(L, 0);
  for (const Segment& seg : schedule) {
    for (int i = seg.begin; i < seg.end; ++i) {
      a.recompute[i] = seg.recompute;
      a.segment_begin[i] = seg.recompute ? seg.begin : i;
      a.segment_end[i] = seg.recompute ? seg.end : i + 1;
    }
  }
  return a;
}

bool has_selective(const Schedule& schedule) {
  for (const Segment& seg : schedule) {
    if (seg.kept_classes >= 0) return true;
  }
  return false;
}

namespace {

void use_variant(Stage& s, int k) {
  s.fwd_time = s.selective_fwd_time[k];
  s.checkpoint_kept_bytes += s.selective_kept_bytes[k];
  s.tail_time = s.selective_tail_time.empty() ? 0.0 : s.selective_tail_time[k];
}

}  // namespace

Chain materialize(const Chain& chain, const Schedule& schedule) {
  Chain out = chain;
  for (const Segment& seg : schedule) {
    if (seg.kept_classes < 0) continue;
    for (int i = seg.begin; i < seg.end; ++i) use_variant(out.stages[i], seg.kept_classes);
  }
  return out;
}

Chain selective_chain(const Chain& chain, int k) {
  Chain out = chain;
  for (int i = 0; i < out.size(); ++i) {
    Stage& s = out.stages[i];
    if (chain.has_variant(i, k)) {
      use_variant(s, k);
    } else {
      s.recomputable = false;
    }
    s.selective_fwd_time.clear();
    s.selective_kept_bytes.clear();
    s.selective_tail_time.clear();
  }
  out.operator_classes.clear();
  return out;
}

double extra_time(const Chain& chain, const Schedule& schedule) {
  double t = 0.0;
  for (const Segment& seg : schedule) {
    if (!seg.recompute) continue;
    const int k = seg.kept_classes;
    for (int i = seg.begin; i < seg.end; ++i) {
      t += k >= 0 ? chain.stages[i].selective_fwd_time[k] : chain.stages[i].fwd_time;
    }
    // The recompute stops before the last stage's tail (use_variant's choice of tail, without copying the chain).
    const Stage& last = chain.stages[seg.end - 1];
    t -= k < 0 ? last.tail_time : (last.selective_tail_time.empty() ? 0.0 : last.selective_tail_time[k]);
  }
  return t;
}

}  // namespace planner
}  // namespace memsave
