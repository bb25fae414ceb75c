// Layouts map (stage, chunk) to virtual stages and back, looped and V-shaped.
#include "pipetrain/schedule/layout.h"

#include <gtest/gtest.h>

#include <set>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

TEST(Layout, LoopedPutsChunkTimesStagesPlusStage) {
  const Layout layout(4, 2);
  //           stage:  0  1  2  3
  const int chunk0[] = {0, 1, 2, 3};
  const int chunk1[] = {4, 5, 6, 7};
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(layout.virtual_stage(j, 0), chunk0[j]);
    EXPECT_EQ(layout.virtual_stage(j, 1), chunk1[j]);
  }
  EXPECT_TRUE(layout.is_first(0, 0));
  EXPECT_TRUE(layout.is_last(3, 1));
  EXPECT_FALSE(layout.is_last(3, 0));
}

TEST(Layout, VShapeDescendsThenClimbsBackToStageZero) {
  const Layout layout(4, 2, LayoutKind::v_shape);
  //           stage:  0  1  2  3
  const int chunk0[] = {0, 1, 2, 3};
  const int chunk1[] = {7, 6, 5, 4};
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(layout.virtual_stage(j, 0), chunk0[j]);
    EXPECT_EQ(layout.virtual_stage(j, 1), chunk1[j]);
  }
  EXPECT_TRUE(layout.is_first(0, 0));
  EXPECT_TRUE(layout.is_last(0, 1));
  // The turn stays on the last stage.
  EXPECT_EQ(layout.placement(3), (Placement{3, 0}));
  EXPECT_EQ(layout.placement(4), (Placement{3, 1}));
}

TEST(Layout, PlacementInvertsVirtualStageForEveryShape) {
  for (LayoutKind kind : {LayoutKind::looped, LayoutKind::v_shape}) {
    for (int P = 1; P <= 6; ++P) {
      for (int V = 1; V <= 4; ++V) {
        const Layout layout(P, V, kind);
        std::set<int> seen;
        for (int j = 0; j < P; ++j) {
          for (int c = 0; c < V; ++c) {
            const int v = layout.virtual_stage(j, c);
            EXPECT_EQ(layout.placement(v), (Placement{j, c}));
            seen.insert(v);
          }
        }
        EXPECT_EQ(static_cast<int>(seen.size()), P * V);
        EXPECT_EQ(*seen.rbegin(), P * V - 1);
      }
    }
  }
}

TEST(Layout, RejectsOutOfRangeIndices) {
  EXPECT_THROW(Layout(0, 1), ScheduleError);
  EXPECT_THROW(Layout(2, 0), ScheduleError);
  const Layout layout(2, 2);
  EXPECT_THROW(layout.virtual_stage(2, 0), ScheduleError);
  EXPECT_THROW(layout.virtual_stage(0, 2), ScheduleError);
  EXPECT_THROW(layout.placement(4), ScheduleError);
  EXPECT_THROW(layout.placement(-1), ScheduleError);
}

}  // namespace
}  // namespace pipetrain::schedule
