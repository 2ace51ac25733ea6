#include "core/settings.h"

#include "backend/cost_model.h"
#include "gflow/error.h"

namespace gflow {
namespace {

[[noreturn]] void badField(const char* field, const std::string& value, const char* want) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("Options::") + field + " is " + value + "; expected " + want,
              ErrorContext::forOp("init"));
}

template <typename T>
void atLeast(const std::optional<T>& v, T lo, const char* field) {
  if (v && *v < lo) badField(field, std::to_string(*v), (">= " + std::to_string(lo)).c_str());
}

void validate(const Options& o) {
  atLeast<uint64_t>(o.shm.chunkBytes, 4096, "shm.chunkBytes");
  atLeast<uint64_t>(o.tuning.pieceBytes, 64, "tuning.pieceBytes");
  atLeast<int>(o.tuning.ringWindow, 1, "tuning.ringWindow");
  atLeast<uint64_t>(o.tuning.hierSegmentBytes, 4096, "tuning.hierSegmentBytes");
  const std::optional<uint64_t>& piece = o.tuning.codecPieceBytes;
  if (piece && *piece != 0 && (*piece < 65536 || *piece > (uint64_t{1} << 40))) {
    badField("tuning.codecPieceBytes", std::to_string(*piece), "0 or 65536 to 2^40");
  }
  atLeast<uint64_t>(o.progress.unexpectedLimitBytes, 1, "progress.unexpectedLimitBytes");
  atLeast<int>(o.progress.spinUs, 0, "progress.spinUs");
  // The range of GFLOW_PROGRESS_PRIORITY, which the field overrides.
  const std::optional<int>& pri = o.progress.priority;
  const params::Range& levels = *params::rangeOf(params::spec::progressPriority);
  if (pri && (*pri < levels.lo || *pri > levels.hi)) {
    badField("progress.priority", std::to_string(*pri),
             (std::to_string(levels.lo) + ".." + std::to_string(levels.hi)).c_str());
  }
  const std::string& b = o.device.backend;
  if (!b.empty() && b != "auto" && b != "nccl" && b != "staged") {
    badField("device.backend", "'" + b + "'", "\"auto\", \"nccl\" or \"staged\"");
  }
}

// Options::shm.singleCopy over GFLOW_SHM_SINGLE_COPY, checked: "auto",
// "off" or a byte range.
std::string resolveSingleCopy(const std::string& option) {
  const bool fromOptions = !option.empty();
  std::string v = fromOptions ? option : params::shmSingleCopy();
  uint64_t lo = 0, hi = 0;
  if (v == "auto" || v == "off" || params::parseByteRange(v, &lo, &hi)) return v;
  const std::string what = "'" + v + "'";
  const char* want = "\"auto\", \"off\" or a byte range such as \"128K-32M\" or \"64K-\"";
  if (fromOptions) badField("shm.singleCopy", what, want);
  throw Error(ErrorCode::kInvalidArgument,
              std::string("GFLOW_SHM_SINGLE_COPY is ") + what + "; expected " + want,
              ErrorContext::forOp("init"));
}

}  // namespace

Settings resolveSettings(const Options& o) {
  params::validateAll();  // a bad GFLOW_* value fails here, not deep inside an op
  validate(o);
  Settings s;
  const bool algoFromOptions = !o.algorithm.empty();
  s.algo = algoFromOptions ? o.algorithm : params::algo();
  s.algoSource = algoFromOptions ? "Options::algorithm" : "GFLOW_ALGO";
  s.shm = o.shm.enabled ? *o.shm.enabled : params::shm() != 0;
  s.shmChunkBytes = o.shm.chunkBytes ? *o.shm.chunkBytes : params::shmChunk();
  s.shmSingleCopy = resolveSingleCopy(o.shm.singleCopy);
  s.rendezvousBytes = o.tcp.rendezvousBytes ? *o.tcp.rendezvousBytes : params::rendezvous();
  s.connect = !o.connect.empty() ? o.connect : params::connect();
  s.rdMaxBytes = o.tuning.rdMaxBytes ? o.tuning.rdMaxBytes : params::rdMaxBytes();
  s.hdMaxBytes = o.tuning.hdMaxBytes ? o.tuning.hdMaxBytes : params::hdMaxBytes();
  s.deviceBackend = !o.device.backend.empty() ? o.device.backend : params::deviceBackend();
  s.verifyDeviceOps = o.device.verifyOps ? *o.device.verifyOps : params::ncclVerify() != 0;
  s.ncclP2P = o.device.p2p ? *o.device.p2p : params::ncclP2P() != 0;
  s.reproducible = o.reproducible ? *o.reproducible : params::reproducible() != 0;
  s.codecPieceBytes = o.tuning.codecPieceBytes ? *o.tuning.codecPieceBytes : params::codecPiece();
  const std::string modelFile = !o.tuning.modelFile.empty() ? o.tuning.modelFile : params::model();
  if (!modelFile.empty()) s.model = backend::CostModel::load(modelFile).text();
  s.tuning = o.tuning;
  s.progress = o.progress;
  return s;
}

std::vector<Settings::Agreed> Settings::agreed() const {
  auto flag = [](bool b) { return std::string(b ? "1" : "0"); };
  return {
      {&params::spec::algo, "Options::algorithm", algo},
      {&params::spec::model, "Options::tuning.modelFile", model},
      {&params::spec::deviceBackend, "Options::device.backend", deviceBackend},
      {&params::spec::ncclVerify, "Options::device.verifyOps", flag(verifyDeviceOps)},
      {&params::spec::ncclP2P, "Options::device.p2p", flag(ncclP2P)},
      {&params::spec::reproducible, "Options::reproducible", flag(reproducible)},
      {&params::spec::shm, "Options::shm.enabled", flag(shm)},
      {&params::spec::shmChunk, "Options::shm.chunkBytes", std::to_string(shmChunkBytes)},
      {&params::spec::shmSingleCopy, "Options::shm.singleCopy", shmSingleCopy},
      {&params::spec::connect, "Options::connect", connect},
      {&params::spec::rendezvous, "Options::tcp.rendezvousBytes", std::to_string(rendezvousBytes)},
      {&params::spec::codecPiece, "Options::tuning.codecPieceBytes",
       std::to_string(codecPieceBytes)},
      {&params::spec::rdMaxBytes, "Options::tuning.rdMaxBytes",
       rdMaxBytes ? std::to_string(*rdMaxBytes) : "auto"},
      {&params::spec::hdMaxBytes, "Options::tuning.hdMaxBytes",
       hdMaxBytes ? std::to_string(*hdMaxBytes) : "auto"},
  };
}

}  // namespace gflow
