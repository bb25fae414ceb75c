// Option checks and dispatch to the generator of each schedule kind.
#include "pipetrain/schedule/generate.h"

#include <fmt/format.h>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

// Keeps a typo such as 1e9 micro-batches from allocating the machine away.
constexpr long kMaxComputeSteps = 1L << 26;

void check_chunks(const ScheduleOptions& o, int v) {
  const char* kind = kind_name(o.kind());
  switch (o.kind()) {
    case ScheduleKind::fill_drain:
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1:
      if (v != 1)
        throw ScheduleError(fmt::format(
            "{} runs one model chunk per stage, got {} chunks: use --kind interleaved (V >= 2 "
            "looped chunks) or --kind zb-v (2 chunks in a V), or drop --chunks",
            kind, v));
      break;
    case ScheduleKind::interleaved:
      if (v < 1)
        throw ScheduleError(
            fmt::format("interleaved needs at least 1 chunk per stage (2 or more "
                        "to interleave; 1 is plain 1f1b), got {}",
                        v));
      break;
    case ScheduleKind::zb_v:
    case ScheduleKind::dualpipe_v:
    case ScheduleKind::v_half:
    case ScheduleKind::v_min:
      if (v != 2)
        throw ScheduleError(
            fmt::format("{} places exactly 2 chunks per stage in a V, got {}: use --chunks 2 (or "
                        "--kind interleaved for other chunk counts)",
                        kind, v));
      break;
    case ScheduleKind::inference:
      if (v < 1)
        throw ScheduleError(fmt::format("inference needs V >= 1 chunks per stage, got {}", v));
      break;
    case ScheduleKind::custom:
      throw ScheduleError("generate: a custom schedule has no generator; build it with lower()");
  }
}

void check_layout(const ScheduleOptions& o) {
  if (!o.layout_set() || o.kind() == ScheduleKind::inference) return;
  const LayoutKind wanted = is_v_shaped(o.kind()) ? LayoutKind::v_shape : LayoutKind::looped;
  if (o.layout_kind() != wanted)
    throw ScheduleError(fmt::format("{} uses the {} layout, not {}: only inference may choose",
                                    kind_name(o.kind()), layout_name(wanted),
                                    layout_name(o.layout_kind())));
}

}  // namespace

int ScheduleOptions::num_chunks() const {
  if (num_chunks_ != 0) return num_chunks_;
  return kind_ == ScheduleKind::interleaved || is_v_shaped(kind_) ? 2 : 1;
}

LayoutKind ScheduleOptions::layout_kind() const {
  if (layout_set_) return layout_;
  return is_v_shaped(kind_) ? LayoutKind::v_shape : LayoutKind::looped;
}

Schedule generate(const ScheduleOptions& o) {
  const int P = o.num_stages();
  const int M = o.num_micro_batches();
  const int V = o.num_chunks();
  if (P < 1) throw ConfigError(fmt::format("--stages must be at least 1, got {}", P));
  if (M < 1) throw ConfigError(fmt::format("--micro-batches must be at least 1, got {}", M));
  check_chunks(o, V);
  check_layout(o);
  // torch's ScheduleDualPipeV makes the same demand: its main phase runs M - 2P + j + 1
  // overlapped pairs on stage j, which stage 0 can only fill with M >= 2P.
  if (o.kind() == ScheduleKind::dualpipe_v && M < 2 * P)
    throw ScheduleError(fmt::format(
        "dualpipev needs at least 2P = {} micro-batches for {} stages (as torch's "
        "ScheduleDualPipeV), got {}: use --micro-batches {} or more, or --kind zb-v / v-half "
        "for fewer micro-batches",
        2 * P, P, M, 2 * P));
  if (static_cast<long>(P) * M * V > kMaxComputeSteps / 3)
    throw ScheduleError(fmt::format(
        "{} stages x {} micro-batches x {} chunks is over the limit of {} (stage, chunk, "
        "micro-batch) triples; fewer micro-batches per step give the same gradients with "
        "gradient accumulation over several steps",
        P, M, V, kMaxComputeSteps / 3));
  const Layout layout(P, V, o.layout_kind());
  const ScheduleKind kind = o.kind();
  ComputeOrder order;
  switch (kind) {
    case ScheduleKind::fill_drain:
      order = fill_drain_order(P, M);
      break;
    case ScheduleKind::one_f_one_b:
      order = one_f_one_b_order(P, M);
      break;
    case ScheduleKind::inference:
      order = inference_order(layout, M);
      break;
    case ScheduleKind::interleaved:
      order = interleaved_order(P, M, V);
      break;
    case ScheduleKind::zb_h1:
      order = zb_h1_order(P, M);
      break;
    case ScheduleKind::zb_v:
      order = zb_v_order(P, M);
      break;
    case ScheduleKind::dualpipe_v:
      order = dualpipe_v_order(P, M);
      break;
    case ScheduleKind::v_half:
      order = v_half_order(P, M);
      break;
    case ScheduleKind::v_min:
      order = v_min_order(P, M);
      break;
    case ScheduleKind::custom:
      break;  // rejected by check_chunks
  }
  return lower(kind, is_training(kind), M, layout, order);
}

}  // namespace pipetrain::schedule
