// The chain model of memsave's checkpoint planner: a training step seen as a sequence of stages, each of which may
// be run normally (kept) or inside a checkpointed segment (activations dropped in forward, recomputed once in
// backward). Pure C++17, no torch.
//
// Memory conventions (all sizes in bytes, all peaks relative to what was allocated before the step):
//   * Boundary j (0 <= j <= L) is the activation between stage j-1 and stage j: stage i reads boundary i
//     (`input_bytes`) and writes boundary i+1 (`output_bytes`). Boundary 0 is the chain input (held by the caller
//     for the whole step), boundary L is the chain output. The gradient of boundary j has `*_grad_bytes` bytes.
//   * `saved_bytes` are the bytes a stage keeps for its backward when run normally, NOT counting storage shared with
//     its input or output boundary (those are counted once, as boundaries). A kept stage is assumed to hold both its
//     input and its output boundary until its own backward has finished.
//   * Part of a boundary may be *passing*: `*_passing_bytes` that neither neighbour keeps for backward (a tensor
//     read by the next stage and then freed, e.g. the input of a ReLU that saves its output). Passing bytes live
//     from the producer's forward to the end of the consumer's forward, unless the consumer starts a checkpointed
//     segment: a segment keeps its whole input until its backward. `input_bytes`/`output_bytes` are the kept part.
//   * `fwd_transient_bytes` / `bwd_transient_bytes` are working memory above everything else that is live while the
//     stage runs (kernel workspaces, temporaries freed before the stage returns).
//   * `param_grad_bytes` are allocated by the stage's backward and live until the end of the step.
//   * A checkpointed segment itself costs memory at runtime (a saved RNG state, snapshots of module buffers):
//     `Chain::segment_bytes` per segment plus `checkpoint_bytes` of each stage in it, held from the segment's forward
//     until the backward of its first stage has finished. While the segment is recomputed the runtime needs that
//     state a second time (fresh copies swapped in): `recompute_bytes` + the stages' checkpoint_bytes on top.
//   * `checkpoint_kept_bytes` are held by a checkpointed segment from the stage's forward until the stage is
//     recomputed, where they become part of the stage's saved bytes (not a second copy): a selective region keeps
//     the outputs of its expensive operators in forward and its recompute reads them back instead of running them.
//   * Selective recompute: `Chain::operator_classes` names P sets of operator classes (the kinds of operators whose
//     outputs a selective region keeps, e.g. "matmul+attention"). A stage may carry one *selective variant* per
//     set: `selective_fwd_time[k]` (the forward time of the operators a region keeping set k recomputes) and
//     `selective_kept_bytes[k]` (the bytes of the outputs it keeps). A segment with `kept_classes == k` is a
//     checkpointed segment run on the variants: materialize() replaces each of its stages' fwd_time by
//     selective_fwd_time[k] and adds selective_kept_bytes[k] to its checkpoint_kept_bytes, and every rule above then
//     applies unchanged (one set of lifetime rules for whole and selective regions).
//   * A Skip is a tensor made by stage `producer` and read by stage `consumer` > producer that is not part of the
//     boundaries in between (a residual or UNet skip connection); its gradient lives from the consumer's backward to
//     the producer's backward.
// The exact lifetime rules are those of simulate() in simulate.h; the solvers use the same rules (see
// cost_terms.h) and the tests check that both agree on every schedule of small chains.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsave {
namespace planner {

struct Stage {
  std::string name;
  double fwd_time = 0.0;  // seconds (or any unit, used consistently) of one forward run
  double bwd_time = 0.0;
  std::int64_t input_bytes = 0;
  std::int64_t output_bytes = 0;
  std::int64_t input_passing_bytes = 0;  // passing part of the input boundary (see above)
  std::int64_t output_passing_bytes = 0;
  std::int64_t input_grad_bytes = 0;   // gradient of the whole input boundary (0 if it does not require grad)
  std::int64_t output_grad_bytes = 0;  // gradient of the whole output boundary
  std::int64_t saved_bytes = 0;
  std::int64_t fwd_transient_bytes = 0;
  std::int64_t bwd_transient_bytes = 0;
  std::int64_t param_grad_bytes = 0;
  std::int64_t checkpoint_bytes = 0;       // extra bytes while the stage is in a checkpointed segment
  std::int64_t checkpoint_kept_bytes = 0;  // held from its forward until its recompute (see above)
  // Of fwd_time, the seconds after the last tensor the stage saves for backward: a recompute ending in this stage
  // stops before them (torch's early stop), so a segment's recompute is its stages' fwd_time less its last one's
  // tail_time.
  double tail_time = 0.0;
  // Selective variants, one per Chain::operator_classes entry, or none (the stage then cannot be in a selective
  // segment); selective_tail_time: each variant's tail_time, or none (no tail).
  std::vector<double> selective_fwd_time;
  std::vector<std::int64_t> selective_kept_bytes;
  std::vector<double> selective_tail_time;
  bool recomputable = true;    // may be placed in a checkpointed segment
  bool joins_previous = true;  // may share a checkpointed segment with the stage before it
};

struct Skip {
  int producer = 0;  // stage index whose forward creates the tensor
  int consumer = 0;  // last stage index whose forward reads it (> producer)
  std::int64_t bytes = 0;
  std::int64_t grad_bytes = 0;
};

struct Chain {
  std::vector<Stage> stages;
  std::vector<Skip> skips;
  std::int64_t base_bytes = 0;       // live for the whole step on top of everything the model describes
  std::int64_t segment_bytes = 0;    // held by each checkpointed segment (see above)
  std::int64_t recompute_bytes = 0;  // extra while a segment is recomputed (see above)
  // The operator-class sets a selective segment may keep, "+"-joined (e.g. "matmul+attention"); may be empty.
  std::vector<std::string> operator_classes;

  int size() const { return static_cast<int>(stages.size()); }

  // Throws std::invalid_argument with a message naming the offending stage/field when the chain is empty, a size
  // or time is negative or not finite, neighbouring boundaries disagree (stage i's output vs stage i+1's input,
  // bytes or gradient bytes), a skip's indices are out of range or not increasing, or a stage's selective variants
  // are neither absent nor one per operator_classes entry.
  void validate() const;

  int num_operator_classes() const { return static_cast<int>(operator_classes.size()); }
  // Whether stage i has a selective variant for operator-class set k.
  bool has_variant(int i, int k) const { return k >= 0 && k < static_cast<int>(stages[i].selective_fwd_time.size()); }

  // Bytes of boundary j (0..L): kept part, passing part, gradient.
  std::int64_t boundary_bytes(int j) const;
  std::int64_t boundary_passing_bytes(int j) const;
  std::int64_t boundary_grad_bytes(int j) const;

  // Sum over stages of fwd_time + bwd_time: the compute of one eager step, the denominator of an overhead ratio.
  double eager_time() const;
};

// A contiguous run of stages [begin, end) that is either kept (run normally) or checkpointed (recompute == true:
// forward keeps only the segment's input, backward re-runs the segment once before its backward). A checkpointed
// segment with kept_classes k >= 0 is selective: it also keeps the outputs of the operators of the chain's
// operator_classes[k] and re-runs only the others (its stages' selective variants); kept_classes -1 recomputes the
// whole segment.
struct Segment {
  int begin = 0;
  int end = 0;  // exclusive
  bool recompute = false;
  int kept_classes = -1;  // index into Chain::operator_classes, -1: none
  bool operator==(const Segment& o) const {
    return begin == o.begin && end == o.end && recompute == o.recompute && kept_classes == o.kept_classes;
  }
};

using Schedule = std::vector<Segment>;

// Throws std::invalid_argument unless the segments cover stages 0..L-1 exactly once, in order, with no empty
// segment, and every checkpointed segment contains only recomputable stages and no stage that refuses to join its
// predecessor (except at the segment's start), and a selective segment (kept_classes >= 0) is checkpointed, names an
// operator-class set of the chain and has only stages with a variant for it.
void validate_schedule(const Chain& chain, const Schedule& schedule);

// True when some segment of the schedule is selective.
bool has_selective(const Schedule& schedule);

// The chain as the schedule runs it: the stages of each selective segment replaced by their variants (fwd_time =
// selective_fwd_time[k], tail_time = selective_tail_time[k], checkpoint_kept_bytes += selective_kept_bytes[k]), so
// that the segment is an ordinary checkpointed one. Call validate_schedule first.
Chain materialize(const Chain& chain, const Schedule& schedule);

// Every stage replaced by its variant for operator-class set k (stages without one become not recomputable), without
// operator classes: the chain whose checkpointed segments are the selective segments keeping set k.
Chain selective_chain(const Chain& chain, int k);

// The same schedule with consecutive kept segments merged and each checkpointed segment left as it is; the
// canonical form the solvers return.
Schedule normalize_schedule(const Schedule& schedule);

// Per-stage view: recompute flag of each stage and the index of the segment start it belongs to (for checkpointed
// stages; kept stages get their own index).
struct StageAssignment {
  std::vector<bool> recompute;
  std::vector<int> segment_begin;
  std::vector<int> segment_end;  // exclusive
};
StageAssignment assign_stages(const Chain& chain, const Schedule& schedule);

// Sum of fwd_time over the stages in checkpointed segments (selective_fwd_time in selective ones), less each
// segment's last stage's tail_time: the extra compute of one step.
double extra_time(const Chain& chain, const Schedule& schedule);

}  // namespace planner
}  // namespace memsave
