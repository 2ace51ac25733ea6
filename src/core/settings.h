// Settings: a communicator's configuration in force, Options over the
// environment over the defaults. Resolved once, at Communicator::create,
// and handed down explicitly through the option structs each layer takes
// (transport::ContextOptions, the shm group options, the host and
// hierarchical backends' tuning, the router's device setup, the executor's
// pinning); a communicator from split() copies its parent's. Fields the
// caller leaves unset in the kLocal groups (tuning, progress) stay unset
// here and are read from the environment by the one layer that uses them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/params.h"
#include "gflow/options.h"

namespace gflow {

struct Settings {
  std::string algo;                    // Options::algorithm, else GFLOW_ALGO
  std::string algoSource;              // where `algo` came from, for error messages
  bool shm = true;                     // Options::shm.enabled, else GFLOW_SHM
  uint64_t shmChunkBytes = 0;          // Options::shm.chunkBytes, else GFLOW_SHM_CHUNK
  std::optional<uint64_t> rdMaxBytes;  // nullopt: the selector's default (auto)
  std::string deviceBackend;           // "auto", "nccl" or "staged"
  bool verifyDeviceOps = true;         // Options::device.verifyOps, else GFLOW_NCCL_VERIFY
  TuningOptions tuning;                // pieceBytes, ringWindow, hierSegmentBytes as given
  ProgressOptions progress;            // as given

  // The value in force of every kAgree parameter (params_table.h) as
  // canonical text, so that equal values agree however they were set, with
  // the Options field that stands in for it.
  struct Agreed {
    const params::Param* param;
    const char* field;
    std::string value;
  };
  std::vector<Agreed> agreed() const;
};

// Validates the Options fields that are set (Error(kInvalidArgument) naming
// the field) and resolves the rest from the environment.
Settings resolveSettings(const Options& options);

}  // namespace gflow
