// Options for creating a communicator. Every field left at its default is
// taken from the environment (GFLOW_*, then torchrun, Open MPI and Slurm
// variables; see docs/configuration.md). Explicit values always win.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "gflow/store.h"

namespace gflow {

struct Options {
  // Identity. -1 means "from the environment".
  int rank = -1;
  int size = -1;
  int localRank = -1;  // -1: from the environment, else derived from host ids
  int localSize = -1;
  // Host identity used to group ranks into hosts (GFLOW_HOST_ID; default
  // hostname + boot id). Ranks with equal ids share memory and form one
  // level of the hierarchy.
  std::string hostId;

  // Rendezvous: either a store the caller brings (ranks as threads, a
  // framework's store), or the address of rank 0's TCP store ("host:port").
  std::shared_ptr<Store> store;
  std::string root;

  // Job secret for the store and data connections (GFLOW_JOB_TOKEN).
  // Empty and unset: no authentication.
  std::string token;

  // Deadline for every blocking step (GFLOW_TIMEOUT, default 300 s).
  std::chrono::milliseconds timeout{0};

  // Network transport between hosts (GFLOW_TRANSPORT): "tcp" (the default).
  // Ranks of one host use shared memory unless GFLOW_SHM=0.
  std::string transport;

  // Algorithm override, same syntax as GFLOW_ALGO (docs/algorithms.md),
  // e.g. "ring" or "allreduce:0-64k:rd,allreduce:64k-:ring".
  std::string algorithm;

  // TCP data path (GFLOW_SOCKET_IFNAME, GFLOW_PORT_RANGE,
  // GFLOW_SOCKETS_PER_PEER). 0 / empty: from the environment or default.
  std::string socketIfname;
  std::string portRange;
  int socketsPerPeer = 0;
};

}  // namespace gflow
