// Streams and handles shared by every channel implementation.
#include "pipetrain/comm/channel.h"

#include "pipetrain/error.h"

namespace pipetrain::comm {

uint32_t Stream::code() const {
  if (chunk < 0 || chunk >= kMaxChunks) {
    throw ConfigError("stream chunk " + std::to_string(chunk) + " is outside [0, " +
                      std::to_string(kMaxChunks) + "); number model chunks from 0");
  }
  return static_cast<uint32_t>(kind) * kMaxChunks + static_cast<uint32_t>(chunk);
}

std::string Stream::describe() const {
  switch (kind) {
    case StreamKind::Activation: return "activation stream (chunk " + std::to_string(chunk) + ")";
    case StreamKind::Gradient: return "gradient stream (chunk " + std::to_string(chunk) + ")";
    case StreamKind::Aux: return "aux stream (chunk " + std::to_string(chunk) + ")";
    case StreamKind::SkipActivation: return "skip stream (link " + std::to_string(chunk) + ")";
    case StreamKind::SkipGradient: return "skip gradient stream (link " + std::to_string(chunk) + ")";
  }
  return "unknown stream";
}

void SendHandle::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw UsageError("waiting on an empty SendHandle; keep the handle isend() returned");
  state_->wait(timeout);
}

bool SendHandle::done() const { return state_ == nullptr || state_->done(); }

Batch RecvHandle::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw UsageError("waiting on an empty RecvHandle; keep the handle irecv() returned");
  return state_->wait(timeout);
}

}  // namespace pipetrain::comm
