// The simulator on chains computed by hand, and the solver's per-segment peak formula against the simulator.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "planner/cost_terms.h"
#include "planner/simulate.h"
#include "random_chain.h"

namespace memsave {
namespace planner {
namespace {

// Three equal stages: boundaries 10 bytes (gradients too), saved 20, forward transient 5, backward transient 7.
Chain uniform3(std::int64_t param_grad = 0) {
  Chain c;
  for (int i = 0; i < 3; ++i) {
    Stage s;
    s.fwd_time = 1.0;
    s.bwd_time = 2.0;
    s.input_bytes = s.output_bytes = s.input_grad_bytes = s.output_grad_bytes = 10;
    s.saved_bytes = 20;
    s.fwd_transient_bytes = 5;
    s.bwd_transient_bytes = 7;
    s.param_grad_bytes = param_grad;
    c.stages.push_back(s);
  }
  return c;
}

TEST(Simulate, NoCheckpointTimelineByHand) {
  const SimResult r = simulate(uniform3(), {{0, 3, false}}, /*keep_timeline=*/true);
  // forward: 10 (input) + per stage 10 (output) + 20 (saved), +5 transient
  // backward start: +10 output gradient; stage 2: +10 input gradient, +7 transient; each stage then frees 40.
  const std::vector<std::int64_t> expected = {45, 75, 105, 110, 127, 97, 67};
  ASSERT_EQ(r.timeline.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(r.timeline[k].live_bytes, expected[k]) << k;
  EXPECT_EQ(r.timeline[3].phase, Phase::kBackwardStart);
  EXPECT_EQ(r.peak_bytes, 127);
  EXPECT_EQ(r.peak_phase, Phase::kBackward);
  EXPECT_EQ(r.peak_stage, 2);
  EXPECT_EQ(r.end_bytes, 20);  // input and its gradient
  EXPECT_DOUBLE_EQ(r.extra_time, 0.0);
}

TEST(Simulate, CheckpointedSegmentByHand) {
  // [0,2) checkpointed, stage 2 kept.
  // fwd0: 10+10 (+5) = 25; fwd1: +10, (+5) = 35, then boundary 1 freed -> 20; fwd2: +10+20 (+5) = 55.
  // backward start +10 = 60. bwd2: +10 (+7) = 77; frees saved, grad 3, boundary 3 and the original boundary 2
  // (the stage before ends a checkpointed segment) -> 20. recompute 0: +20+10 (+5) = 55; recompute 1: +30 (+5) = 85.
  // bwd1: +10 (+7) = 97; frees 40 -> 50. bwd0: +10 (+7) = 67; frees 40 -> 20.
  const SimResult r = simulate(uniform3(), {{0, 2, true}, {2, 3, false}}, true);
  const std::vector<std::int64_t> expected = {25, 35, 55, 60, 77, 55, 85, 97, 67};
  ASSERT_EQ(r.timeline.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(r.timeline[k].live_bytes, expected[k]) << k;
  EXPECT_EQ(r.timeline[5].phase, Phase::kRecompute);
  EXPECT_EQ(r.timeline[5].stage, 0);
  EXPECT_EQ(r.peak_bytes, 97);
  EXPECT_EQ(r.peak_stage, 1);
  EXPECT_DOUBLE_EQ(r.extra_time, 2.0);
  EXPECT_EQ(r.end_bytes, 20);
}

TEST(Simulate, ParameterGradientsAccumulate) {
  // As the first test plus 4 bytes of parameter gradients per stage that stay to the end.
  const SimResult r = simulate(uniform3(4), {{0, 3, false}});
  EXPECT_EQ(r.peak_bytes, 131);  // 110 + 10 + 4 + 7
  EXPECT_EQ(r.end_bytes, 32);
}

TEST(Simulate, PassingBoundaryByHand) {
  // Boundary 1 is only passing (8 bytes): nobody keeps it for backward.
  Chain c = uniform3();
  c.stages[0].output_bytes = c.stages[1].input_bytes = 0;
  c.stages[0].output_passing_bytes = c.stages[1].input_passing_bytes = 8;
  c.stages[0].output_grad_bytes = c.stages[1].input_grad_bytes = 8;
  // No checkpoint: fwd0 = 10 + 8 + 20 (+5) = 43; fwd1 = 38 + 30 (+5) = 73, then the 8 passing bytes go -> 60;
  // fwd2 = 90 (+5) = 95; backward start 100; bwd2 = 110 (+7) = 117 -> frees 40 -> 70;
  // bwd1 = 70 + 8 (grad 1) (+7) = 85 -> frees saved 20, grad 2, boundary 2 -> 38; bwd0 = 38 + 10 (+7) = 55.
  const SimResult none = simulate(c, {{0, 3, false}}, true);
  const std::vector<std::int64_t> expected = {43, 73, 95, 100, 117, 85, 55};
  ASSERT_EQ(none.timeline.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(none.timeline[k].live_bytes, expected[k]) << k;
  // Stage 1 starts a checkpointed segment: it keeps its input (passing bytes included) until its backward.
  // fwd0 43; fwd1 = 38 + 10 (+5) = 53; fwd2 = 48 + 30 (+5) = 83; start 88; bwd2 = 98 (+7) = 105 -> frees 40 and
  // the original boundary 2 -> 48; recompute 1 = 48 + 30 (+5) = 83; bwd1 = 78 + 8 (+7) = 93 -> frees 40 and the
  // 8 passing bytes -> 38; bwd0 = 38 + 10 (+7) = 55.
  const SimResult seg = simulate(c, {{0, 1, false}, {1, 2, true}, {2, 3, false}}, true);
  const std::vector<std::int64_t> expected_seg = {43, 53, 83, 88, 105, 83, 93, 55};
  ASSERT_EQ(seg.timeline.size(), expected_seg.size());
  for (std::size_t k = 0; k < expected_seg.size(); ++k) {
    EXPECT_EQ(seg.timeline[k].live_bytes, expected_seg[k]) << k;
  }
  EXPECT_EQ(seg.end_bytes, 20);
}

TEST(Simulate, SkipConnectionByHand) {
  Chain c = uniform3();
  c.skips.push_back(Skip{0, 2, 8, 8});
  // No checkpoint: skip live from stage 0's forward to its backward, its gradient from stage 2's backward on.
  // bwd2 = 10+3*30+8 (forward) + 10 (grad 3) + 8 (skip grad) + 10 (grad 2) + 7 = 143.
  EXPECT_EQ(simulate(c, {{0, 3, false}}).peak_bytes, 143);
  // [0,2) checkpointed: the skip leaves the segment, so its original lives until backward reaches the segment,
  // then it is recomputed: bwd1 = 10 (input) + 10 (grad 2) + 8 (skip grad) + 20+10+8 (recomputed stage 0) +
  // 20+10 (stage 1) + 10 (grad 1) + 7 = 113.
  EXPECT_EQ(simulate(c, {{0, 2, true}, {2, 3, false}}).peak_bytes, 113);
  // Everything in one segment: the skip is internal, freed after stage 2's forward; the peak is stage 2's backward
  // after recomputing all three stages, as without checkpointing.
  const SimResult all = simulate(c, {{0, 3, true}}, true);
  EXPECT_EQ(all.peak_bytes, 143);
  EXPECT_EQ(all.timeline[2].live_bytes, 43);  // forward 2: input 10, boundaries 2 and 3, skip 8, transient 5
  // Zero-byte gradient: the skip does not require grad.
  c.skips[0].grad_bytes = 0;
  EXPECT_EQ(simulate(c, {{0, 3, false}}).peak_bytes, 135);
}

TEST(Simulate, SkipIntervalAddsBytesOnlyWhileLive) {
  // A skip's bytes appear in forward moments from its producer on, and not before.
  Chain c = uniform3();
  const SimResult plain = simulate(c, {{0, 3, false}}, true);
  c.skips.push_back(Skip{1, 2, 6, 0});
  const SimResult with = simulate(c, {{0, 3, false}}, true);
  ASSERT_EQ(plain.timeline.size(), with.timeline.size());
  EXPECT_EQ(with.timeline[0].live_bytes, plain.timeline[0].live_bytes);      // forward 0
  EXPECT_EQ(with.timeline[1].live_bytes, plain.timeline[1].live_bytes + 6);  // forward 1 made it
  EXPECT_EQ(with.timeline[6].live_bytes, plain.timeline[6].live_bytes);      // backward 0: freed by backward 1
}

TEST(Simulate, SegmentOverheadIsHeldUntilTheSegmentsBackward) {
  Chain c = uniform3();
  c.segment_bytes = 100;
  c.stages[0].checkpoint_bytes = 3;
  c.stages[1].checkpoint_bytes = 4;
  c.stages[2].checkpoint_bytes = 1000;  // kept: never counted
  const SimResult plain = simulate(uniform3(), {{0, 2, true}, {2, 3, false}}, true);
  const SimResult with = simulate(c, {{0, 2, true}, {2, 3, false}}, true);
  ASSERT_EQ(plain.timeline.size(), with.timeline.size());
  // Held at every moment up to the backward of stage 0 (the last moment), and needed a second time while the
  // segment is recomputed (its checkpoint_bytes, 3 + 4).
  for (std::size_t k = 0; k < with.timeline.size(); ++k) {
    const bool recomputing = with.timeline[k].phase == Phase::kRecompute;
    EXPECT_EQ(with.timeline[k].live_bytes, plain.timeline[k].live_bytes + 107 + (recomputing ? 7 : 0)) << k;
  }
  EXPECT_EQ(with.end_bytes, plain.end_bytes);
  EXPECT_EQ(simulate(c, {{0, 3, false}}).peak_bytes, simulate(uniform3(), {{0, 3, false}}).peak_bytes);
  // recompute_bytes come on top during the recompute only.
  c.recompute_bytes = 50;
  const SimResult rec = simulate(c, {{0, 2, true}, {2, 3, false}}, true);
  for (std::size_t k = 0; k < rec.timeline.size(); ++k) {
    const bool recomputing = rec.timeline[k].phase == Phase::kRecompute;
    EXPECT_EQ(rec.timeline[k].live_bytes, with.timeline[k].live_bytes + (recomputing ? 50 : 0)) << k;
  }
}

// uniform3 with one operator-class set: stage 0 keeps 6 bytes of operator outputs and recomputes in 0.25 time units,
// stage 1 keeps 4 and recomputes in 0.5 (stage 2 has no variant).
Chain uniform3_selective() {
  Chain c = uniform3();
  c.operator_classes = {"matmul"};
  c.stages[0].selective_fwd_time = {0.25};
  c.stages[0].selective_kept_bytes = {6};
  c.stages[1].selective_fwd_time = {0.5};
  c.stages[1].selective_kept_bytes = {4};
  return c;
}

TEST(Simulate, SelectiveSegmentByHand) {
  const Chain c = uniform3_selective();
  const SimResult whole = simulate(c, {{0, 2, true}, {2, 3, false}}, true);
  const SimResult sel = simulate(c, {{0, 2, true, 0}, {2, 3, false}}, true);
  // The kept outputs are held from each stage's forward until it is recomputed, then they are its saved bytes.
  // Moments: fwd0, fwd1, fwd2, backward start, bwd2, recompute 0, recompute 1, bwd1, bwd0.
  const std::vector<std::int64_t> extra = {6, 10, 10, 10, 10, 4, 0, 0, 0};
  ASSERT_EQ(sel.timeline.size(), extra.size());
  for (std::size_t k = 0; k < extra.size(); ++k) {
    EXPECT_EQ(sel.timeline[k].live_bytes, whole.timeline[k].live_bytes + extra[k]) << k;
  }
  EXPECT_DOUBLE_EQ(whole.extra_time, 2.0);
  EXPECT_DOUBLE_EQ(sel.extra_time, 0.75);
  EXPECT_EQ(sel.end_bytes, whole.end_bytes);
  EXPECT_EQ(evaluate_peak(c, {{0, 2, true, 0}, {2, 3, false}}), sel.peak_bytes);
  // The same as a whole segment of the materialized chain.
  const Chain m = materialize(c, {{0, 2, true, 0}, {2, 3, false}});
  EXPECT_EQ(m.stages[0].fwd_time, 0.25);
  EXPECT_EQ(m.stages[1].checkpoint_kept_bytes, 4);
  EXPECT_EQ(m.stages[2].fwd_time, 1.0);
  EXPECT_EQ(simulate(m, {{0, 2, true}, {2, 3, false}}).peak_bytes, sel.peak_bytes);
}

// A recompute stops after the last tensor its segment saves: only the tail of the segment's last stage is not run.
TEST(Simulate, TailTimeIsLeftOutAtASegmentsEndOnly) {
  Chain c = uniform3_selective();
  c.stages[0].tail_time = 0.5;
  c.stages[1].tail_time = 0.25;
  c.stages[1].selective_tail_time = {0.125};
  EXPECT_DOUBLE_EQ(simulate(c, {{0, 2, true}, {2, 3, false}}).extra_time, 2.0 - 0.25);
  EXPECT_DOUBLE_EQ(simulate(c, {{0, 1, true}, {1, 2, true}, {2, 3, false}}).extra_time, 2.0 - 0.5 - 0.25);
  EXPECT_DOUBLE_EQ(simulate(c, {{0, 2, true, 0}, {2, 3, false}}).extra_time, 0.75 - 0.125);
  // Stage 0's variant has no tail (its selective_tail_time is empty): a selective segment ending there saves none.
  EXPECT_DOUBLE_EQ(simulate(c, {{0, 1, true, 0}, {1, 3, false}}).extra_time, 0.25);
  // The peak does not depend on tails.
  EXPECT_EQ(simulate(c, {{0, 2, true}, {2, 3, false}}).peak_bytes,
            simulate(uniform3_selective(), {{0, 2, true}, {2, 3, false}}).peak_bytes);
}

TEST(Simulate, InvalidSelectiveScheduleThrows) {
  const Chain c = uniform3_selective();
  EXPECT_THROW(simulate(c, {{0, 2, false, 0}, {2, 3, false}}), std::invalid_argument);  // kept, not selective
  EXPECT_THROW(simulate(c, {{0, 2, true, 1}, {2, 3, false}}), std::invalid_argument);   // no set 1
  EXPECT_THROW(simulate(c, {{0, 2, true, -2}, {2, 3, false}}), std::invalid_argument);
  EXPECT_THROW(simulate(c, {{0, 3, true, 0}}), std::invalid_argument);  // stage 2 has no variant
  EXPECT_NO_THROW(simulate(c, {{0, 3, true}}));
  EXPECT_THROW(simulate(uniform3(), {{0, 3, true, 0}}), std::invalid_argument);  // a chain without sets
}

TEST(Simulate, InvalidScheduleThrows) {
  Chain c = uniform3();
  EXPECT_THROW(simulate(c, {{0, 2, true}}), std::invalid_argument);
  c.stages[0].recomputable = false;
  EXPECT_THROW(simulate(c, {{0, 3, true}}), std::invalid_argument);
}

TEST(CostTerms, FormulaEqualsSimulatorOnEverySchedule) {
  std::mt19937 rng(1234);
  int checked = 0, selective = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + trial % 7;
    testing_util::RandomChainOptions opt;
    opt.max_skips = 4;
    const Chain c = testing_util::random_chain(rng, L, testing_util::exhaustive_options(L, opt));
    testing_util::for_each_schedule(c, [&](const Schedule& s) {
      ASSERT_EQ(evaluate_peak(c, s), simulate(c, s).peak_bytes) << "trial " << trial;
      ++checked;
      selective += has_selective(s);
    });
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(selective, 5000);  // schedules with selective segments are a large part of the check
}

}  // namespace
}  // namespace planner
}  // namespace memsave
