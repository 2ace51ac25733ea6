// Settings: a communicator's configuration in force, Options over the
// environment over the defaults. Resolved once, at Communicator::create,
// and handed down explicitly through the option structs each layer takes
// (transport::ContextOptions, the shm group options, the host and
// hierarchical backends' tuning, the router's device setup, the executor's
// pinning); a communicator from split() copies its parent's. The kAgree
// parameters are resolved here, since the creation-time agreement compares
// the values in force; the kLocal fields of Options::tuning and
// Options::progress travel as given, and a field left unset is read from
// the environment by the one layer that uses it.
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
  std::string shmSingleCopy;           // Options::shm.singleCopy, else GFLOW_SHM_SINGLE_COPY
  std::string connect;                 // Options::connect, else GFLOW_CONNECT
  uint64_t rendezvousBytes = 0;        // Options::tcp.rendezvousBytes, else GFLOW_RENDEZVOUS
  std::optional<uint64_t> rdMaxBytes;  // Options::tuning.rdMaxBytes, else GFLOW_RD_MAX_BYTES
  std::optional<uint64_t> hdMaxBytes;  // Options::tuning.hdMaxBytes, else GFLOW_HD_MAX_BYTES
                                       // (nullopt: auto, the selector's default)
  std::string deviceBackend;           // Options::device.backend, else GFLOW_DEVICE_BACKEND
  bool verifyDeviceOps = true;         // Options::device.verifyOps, else GFLOW_NCCL_VERIFY
  bool ncclP2P = false;                // Options::device.p2p, else GFLOW_NCCL_P2P
  bool reproducible = false;           // Options::reproducible, else GFLOW_REPRODUCIBLE
  uint64_t codecPieceBytes = 0;        // Options::tuning.codecPieceBytes, else GFLOW_CODEC_PIECE
  // Options::tuning.modelFile, else GFLOW_MODEL: the cost model's text
  // (backend/cost_model.h), "" for none.
  std::string model;
  TuningOptions tuning;      // pieceBytes, ringWindow, hierSegmentBytes as given
  ProgressOptions progress;  // as given

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
// the field) and resolves the kAgree parameters, Options over the
// environment. Throws what a malformed GFLOW_* value throws (naming it).
Settings resolveSettings(const Options& options);

}  // namespace gflow
