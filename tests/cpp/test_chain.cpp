// Chain and schedule validation.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>

#include "planner/chain.h"

namespace memsave {
namespace planner {
namespace {

Chain three_stages() {
  Chain c;
  for (int i = 0; i < 3; ++i) {
    Stage s;
    s.name = "s" + std::to_string(i);
    s.fwd_time = 1.0 + i;
    s.bwd_time = 2.0;
    s.input_bytes = s.output_bytes = 10;
    s.input_grad_bytes = s.output_grad_bytes = 10;
    c.stages.push_back(s);
  }
  return c;
}

TEST(Chain, ValidChainPasses) {
  EXPECT_NO_THROW(three_stages().validate());
}

TEST(Chain, EmptyChainIsRejected) {
  EXPECT_THROW(Chain{}.validate(), std::invalid_argument);
}

TEST(Chain, MismatchedBoundaryIsRejectedWithStageNames) {
  Chain c = three_stages();
  c.stages[1].output_bytes = 11;
  try {
    c.validate();
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'s1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'s2'"), std::string::npos) << e.what();
  }
  c = three_stages();
  c.stages[0].output_grad_bytes = 0;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.stages[0].output_passing_bytes = 4;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].input_passing_bytes = 4;
  EXPECT_NO_THROW(c.validate());
}

TEST(Chain, NegativeOrNonFiniteValuesAreRejected) {
  Chain c = three_stages();
  c.stages[2].saved_bytes = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.stages[0].fwd_time = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.stages[0].bwd_time = -0.5;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.base_bytes = -3;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.segment_bytes = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = three_stages();
  c.stages[1].checkpoint_bytes = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

TEST(Chain, TailsArePartOfTheirForwardAndOnePerSetOrNone) {
  Chain c = three_stages();
  c.operator_classes = {"matmul", "matmul+attention"};
  c.stages[1].selective_fwd_time = {0.5, 0.1};
  c.stages[1].selective_kept_bytes = {4, 1};
  c.stages[1].selective_tail_time = {0.5};  // tails: none, or one per set
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].selective_tail_time = {0.5, 0.2};  // more than the variant's forward (0.1)
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].selective_tail_time = {0.5, 0.1};
  EXPECT_NO_THROW(c.validate());
  c.stages[1].tail_time = c.stages[1].fwd_time + 1.0;  // a tail is part of the stage's forward
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].tail_time = -1.0;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].tail_time = c.stages[1].fwd_time;
  EXPECT_NO_THROW(c.validate());
}

TEST(Chain, SelectiveVariantsAreOnePerOperatorClassSetOrNone) {
  Chain c = three_stages();
  c.operator_classes = {"matmul", "matmul+attention"};
  EXPECT_NO_THROW(c.validate());  // no stage has variants: selective segments are simply not possible
  c.stages[0].selective_fwd_time = {0.5, 0.25};
  c.stages[0].selective_kept_bytes = {4, 8};
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(c.has_variant(0, 1));
  EXPECT_FALSE(c.has_variant(1, 0));
  c.stages[1].selective_fwd_time = {0.5};  // one operator-class set short
  c.stages[1].selective_kept_bytes = {4};
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].selective_fwd_time = {0.5, 0.1};
  EXPECT_THROW(c.validate(), std::invalid_argument);  // times and bytes disagree in length
  c.stages[1].selective_kept_bytes = {4, -1};
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].selective_kept_bytes = {4, 1};
  c.stages[1].selective_fwd_time = {0.5, -0.1};
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[1].selective_fwd_time = {0.5, 0.1};
  c.stages[2].checkpoint_kept_bytes = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.stages[2].checkpoint_kept_bytes = 0;
  EXPECT_NO_THROW(c.validate());
  // The selective chain of a set: variants in place, stages without one not recomputable, no operator classes left.
  const Chain s = selective_chain(c, 1);
  EXPECT_EQ(s.stages[0].fwd_time, 0.25);
  EXPECT_EQ(s.stages[0].checkpoint_kept_bytes, 8);
  EXPECT_EQ(s.stages[1].checkpoint_kept_bytes, 1);
  EXPECT_FALSE(s.stages[2].recomputable);
  EXPECT_TRUE(s.operator_classes.empty());
  EXPECT_NO_THROW(s.validate());
  // Extra time of a schedule counts a selective segment's variant times.
  EXPECT_DOUBLE_EQ(extra_time(c, {{0, 2, true, 1}, {2, 3, false}}), 0.35);
  EXPECT_FALSE(has_selective({{0, 2, true}, {2, 3, false}}));
  EXPECT_TRUE(has_selective({{0, 2, true, 0}, {2, 3, false}}));
}

TEST(Chain, BadSkipsAreRejected) {
  Chain c = three_stages();
  c.skips.push_back(Skip{1, 1, 4, 4});
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.skips = {Skip{0, 3, 4, 4}};
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.skips = {Skip{0, 2, -4, 4}};
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.skips = {Skip{0, 2, 4, 4}};
  EXPECT_NO_THROW(c.validate());
}

TEST(Chain, BoundariesAndEagerTime) {
  Chain c = three_stages();
  c.stages[2].output_bytes = 3;
  c.stages[2].output_grad_bytes = 1;
  EXPECT_EQ(c.boundary_bytes(0), 10);
  EXPECT_EQ(c.boundary_bytes(3), 3);
  EXPECT_EQ(c.boundary_grad_bytes(3), 1);
  EXPECT_DOUBLE_EQ(c.eager_time(), 1 + 2 + 3 + 3 * 2.0);
}

TEST(Schedule, CoverageIsChecked) {
  const Chain c = three_stages();
  EXPECT_NO_THROW(validate_schedule(c, {{0, 2, true}, {2, 3, false}}));
  EXPECT_THROW(validate_schedule(c, {{0, 2, true}}), std::invalid_argument);                 // gap at the end
  EXPECT_THROW(validate_schedule(c, {{0, 2, true}, {1, 3, false}}), std::invalid_argument);  // overlap
  EXPECT_THROW(validate_schedule(c, {{0, 0, true}, {0, 3, false}}), std::invalid_argument);  // empty
  EXPECT_THROW(validate_schedule(c, {{0, 4, false}}), std::invalid_argument);                // past the end
  EXPECT_THROW(validate_schedule(c, {}), std::invalid_argument);
}

TEST(Schedule, FlagsAreRespected) {
  Chain c = three_stages();
  c.stages[1].recomputable = false;
  EXPECT_THROW(validate_schedule(c, {{0, 2, true}, {2, 3, false}}), std::invalid_argument);
  EXPECT_NO_THROW(validate_schedule(c, {{0, 2, false}, {2, 3, true}}));
  c = three_stages();
  c.stages[1].joins_previous = false;
  EXPECT_THROW(validate_schedule(c, {{0, 2, true}, {2, 3, false}}), std::invalid_argument);
  EXPECT_NO_THROW(validate_schedule(c, {{0, 1, true}, {1, 3, true}}));
}

TEST(Schedule, NormalizeMergesKeptRunsOnly) {
  const Schedule s = {{0, 1, false}, {1, 2, false}, {2, 3, true}, {3, 4, true}, {4, 5, false}};
  const Schedule n = normalize_schedule(s);
  ASSERT_EQ(n.size(), 4u);
  EXPECT_EQ(n[0], (Segment{0, 2, false}));
  EXPECT_EQ(n[1], (Segment{2, 3, true}));
  EXPECT_EQ(n[2], (Segment{3, 4, true}));
  EXPECT_EQ(n[3], (Segment{4, 5, false}));
}

TEST(Schedule, AssignmentAndExtraTime) {
  const Chain c = three_stages();
  const Schedule s = {{0, 2, true}, {2, 3, false}};
  const StageAssignment a = assign_stages(c, s);
  EXPECT_TRUE(a.recompute[0] && a.recompute[1] && !a.recompute[2]);
  EXPECT_EQ(a.segment_begin[1], 0);
  EXPECT_EQ(a.segment_end[0], 2);
  EXPECT_EQ(a.segment_begin[2], 2);
  EXPECT_DOUBLE_EQ(extra_time(c, s), 1.0 + 2.0);
}

}  // namespace
}  // namespace planner
}  // namespace memsave
