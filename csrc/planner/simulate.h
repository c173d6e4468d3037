// The reference cost model: replays one training step of a chain under a schedule, allocation by allocation, and
// reports the peak of live bytes. Written as a plain event simulation (not in terms of the solver's formulas) so
// that the tests can hold the solvers to it.
//
// Lifetime rules (conservative where the real runtime may free earlier):
// Forward, stage i in order: the first stage of a checkpointed segment first allocates the segment's own overhead
//   (segment_bytes + the checkpoint_bytes of its stages, freed after the backward of that first stage). Then the
//   stage's output boundary (kept and passing parts) and the skips it produces are allocated, plus its saved bytes
//   if it is kept or its checkpoint_kept_bytes if it is checkpointed; the moment "forward i" adds
//   fwd_transient_bytes. Then a kept stage frees the passing part of its
//   input; a stage inside a checkpointed segment other than its first frees its whole input boundary and the skips
//   it consumes that were produced in the same checkpointed segment (the first stage keeps its input). After the
//   last stage, the passing part of boundary L is freed.
// Backward starts by allocating the output gradient (boundary L), then frees the kept part of boundary L if the last
//   stage was checkpointed. Stages then run in reverse. On reaching the last stage e of a
//   checkpointed segment [b, e]: skips produced in it and read after it are freed (their originals), the
//   recompute's own state is allocated (recompute_bytes + the segment's checkpoint_bytes, freed when the re-run
//   ends), stages b..e are re-run in order, each freeing its checkpoint_kept_bytes (read back, they become part of
//   its saved bytes) and allocating its saved bytes, a new copy of its output boundary and
//   of the skips it produces; moment "recompute j" adds fwd_transient_bytes; then stage j frees the copy of its
//   input's passing part (j > b); the passing part of the last output copy is freed when the re-run ends.
//   The backward of stage i (kept or recomputed) allocates the gradients of the skips it consumes, the gradient of
//   its input boundary and its parameter gradients; moment "backward i" adds bwd_transient_bytes; then it frees its
//   saved bytes, the gradient of its output boundary, its output boundary (the copy it holds), its input boundary if
//   the stage before it ends a checkpointed segment, the passing part of its input if it starts a checkpointed
//   segment, the skips it produced and their gradients. The chain input, its gradient and all parameter gradients
//   stay to the end.
// A selective segment (kept_classes k) is simulated as a checkpointed segment of materialize(chain, schedule): its
//   stages' fwd_time and checkpoint_kept_bytes are those of their selective variants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/chain.h"

namespace memsave {
namespace planner {

enum class Phase { kForward = 0, kBackwardStart = 1, kRecompute = 2, kBackward = 3 };

const char* phase_name(Phase p);

struct Moment {
  Phase phase;
  int stage;                // the stage running (L for kBackwardStart)
  std::int64_t live_bytes;  // everything live at that moment, transient working memory included
};

struct SimResult {
  std::int64_t peak_bytes = 0;
  Phase peak_phase = Phase::kForward;
  int peak_stage = 0;
  double extra_time = 0.0;       // recompute: sum of fwd_time over checkpointed stages
  std::int64_t end_bytes = 0;    // live after the step: base, chain input, its gradient, parameter gradients
  std::vector<Moment> timeline;  // filled only when asked for
};

// Simulates one forward+backward step of `chain` under `schedule` (validated first; throws std::invalid_argument on
// a bad chain or schedule).
// Example: SimResult r = simulate(chain, {{0, 2, true}, {2, 3, false}});  // r.peak_bytes
SimResult simulate(const Chain& chain, const Schedule& schedule, bool keep_timeline = false);

}  // namespace planner
}  // namespace memsave
