// Where each part of the model lives: (stage, local chunk) <-> virtual stage.
//
// A model cut into P * V consecutive parts ("virtual stages" 0 .. P*V-1) runs on P stages with
// V chunks each. The engine builds stage j's chunk c from the layers of virtual stage
// virtual_stage(j, c); activations flow from virtual stage v to v+1, gradients from v+1 to v.
//
//   looped  (1F1B, interleaved; V = 1 is the plain layout)   v_shape (ZB-V, V = 2)
//     virtual = chunk * P + stage                              chunk 0 descends, chunk 1 ascends
//
//     stage:      0   1   2   3                                stage:      0   1   2   3
//     chunk 0:    0   1   2   3                                chunk 0:    0   1   2   3
//     chunk 1:    4   5   6   7                                chunk 1:    7   6   5   4
//
// In v_shape the last virtual stage lives on stage 0 (which therefore loads both inputs and
// labels) and the turn 3 -> 4 stays on stage 3. With more chunks v_shape zigzags: even chunks
// descend, odd chunks ascend.
#pragma once

#include <string_view>

namespace pipetrain::schedule {

enum class LayoutKind { looped, v_shape };

const char* layout_name(LayoutKind kind);  // "looped", "v_shape"

struct Placement {
  int stage = 0;
  int chunk = 0;
  bool operator==(const Placement& o) const { return stage == o.stage && chunk == o.chunk; }
};

class Layout {
 public:
  Layout() = default;  // one stage, one chunk
  // Throws ScheduleError unless num_stages >= 1 and num_chunks >= 1.
  Layout(int num_stages, int num_chunks, LayoutKind kind = LayoutKind::looped);

  int num_stages() const { return num_stages_; }
  int num_chunks() const { return num_chunks_; }
  int num_virtual_stages() const { return num_stages_ * num_chunks_; }
  LayoutKind kind() const { return kind_; }

  // Both throw ScheduleError for an index out of range.
  int virtual_stage(int stage, int chunk) const {
    if (stage < 0 || stage >= num_stages_ || chunk < 0 || chunk >= num_chunks_)
      out_of_range(stage, chunk);
    const bool ascending = kind_ == LayoutKind::v_shape && chunk % 2 == 1;
    return chunk * num_stages_ + (ascending ? num_stages_ - 1 - stage : stage);
  }
  Placement placement(int virtual_stage) const {
    if (virtual_stage < 0 || virtual_stage >= num_virtual_stages()) out_of_range(virtual_stage);
    const int chunk = virtual_stage / num_stages_;
    const int offset = virtual_stage % num_stages_;
    const bool ascending = kind_ == LayoutKind::v_shape && chunk % 2 == 1;
    return {ascending ? num_stages_ - 1 - offset : offset, chunk};
  }

  // The stage holding virtual stage 0 loads inputs; the one holding the last loads labels
  // and computes the loss at the end of that chunk's forward.
  bool is_first(int stage, int chunk) const { return virtual_stage(stage, chunk) == 0; }
  bool is_last(int stage, int chunk) const {
    return virtual_stage(stage, chunk) == num_virtual_stages() - 1;
  }

  bool operator==(const Layout& o) const {
    return num_stages_ == o.num_stages_ && num_chunks_ == o.num_chunks_ && kind_ == o.kind_;
  }
  bool operator!=(const Layout& o) const { return !(*this == o); }

 private:
  [[noreturn]] void out_of_range(int stage, int chunk) const;
  [[noreturn]] void out_of_range(int virtual_stage) const;

  int num_stages_ = 1;
  int num_chunks_ = 1;
  LayoutKind kind_ = LayoutKind::looped;
};

}  // namespace pipetrain::schedule
