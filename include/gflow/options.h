// Options for creating a communicator. Every field left at its default is
// taken from the environment (GFLOW_*, then torchrun, Open MPI and Slurm
// variables; see docs/configuration.md). Explicit values always win. The
// environment is read once per process; the values are resolved per
// communicator at Communicator::create, and a communicator from split()
// inherits its parent's. A value out of the range noted beside its field
// throws Error(kInvalidArgument) naming the field (TcpOptions and
// VerbsOptions values are checked by the transport, which names the
// variable). The two process-wide settings, the log level and
// the CUDA component's path, are in gflow/process.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gflow/store.h"

namespace gflow {

// The TCP transport. Each field left unset is taken from its GFLOW_*
// variable, else the default (docs/configuration.md).
struct TcpOptions {
  std::string socketIfname;                   // GFLOW_SOCKET_IFNAME
  std::string portRange;                      // GFLOW_PORT_RANGE
  std::optional<int> socketsPerPeer;          // GFLOW_SOCKETS_PER_PEER (1-64)
  std::optional<uint64_t> stripeMinBytes;     // GFLOW_STRIPE_MIN
  std::optional<uint64_t> stripeChunkBytes;   // GFLOW_STRIPE_CHUNK (0: equal split)
  std::optional<uint64_t> socketBufferBytes;  // GFLOW_SOCKET_BUFFER
  std::string congestion;                     // GFLOW_TCP_CONGESTION (auto, system, a name)
  // GFLOW_RENDEZVOUS: messages of at least this size wait for their receive
  // (0: none do); every rank must use the same value.
  std::optional<uint64_t> rendezvousBytes;
};

// The RDMA verbs transport (GFLOW_TRANSPORT=verbs or Options::transport).
// Each field left unset is taken from its GFLOW_IB_* variable, else the
// default (docs/configuration.md).
struct VerbsOptions {
  std::string hca;                        // GFLOW_IB_HCA ("mlx5_0:1,mlx5_1")
  std::optional<int> gidIndex;            // GFLOW_IB_GID_INDEX (unset there: auto)
  std::optional<int> timeout;             // GFLOW_IB_TIMEOUT (1-31)
  std::optional<int> retryCount;          // GFLOW_IB_RETRY_CNT (0-7)
  std::optional<int> mtu;                 // GFLOW_IB_MTU (bytes; 0: the port's)
  std::optional<int> qpsPerPeer;          // GFLOW_IB_QPS_PER_PEER
  std::optional<uint64_t> eagerBytes;     // GFLOW_IB_EAGER_BYTES
  std::optional<int> eagerSlots;          // GFLOW_IB_EAGER_SLOTS
  std::optional<uint64_t> regCacheBytes;  // GFLOW_IB_REG_CACHE
};

// Shared memory between the ranks of one host. Every rank of a communicator
// must use the same values (checked at creation, whether set here or in the
// environment).
struct ShmOptions {
  std::optional<bool> enabled;         // GFLOW_SHM (false: the network transport)
  std::optional<uint64_t> chunkBytes;  // GFLOW_SHM_CHUNK: pipelining chunk (>= 4096)
  // GFLOW_SHM_SINGLE_COPY: "auto", "off", or a byte range "LO-HI" of
  // allreduces that read the other local ranks' buffers directly where the
  // kernel allows it (docs/algorithms.md). Empty: the environment's.
  std::string singleCopy;
};

// Algorithm tuning beside Options::algorithm (docs/algorithms.md).
struct TuningOptions {
  std::optional<uint64_t> pieceBytes;  // GFLOW_PIECE_BYTES: ring pipelining piece (>= 64)
  std::optional<int> ringWindow;       // GFLOW_RING_WINDOW: ring pieces in flight (>= 1)
  // GFLOW_RD_MAX_BYTES: allreduces up to this size use recursive doubling
  // (unset there: a per world size default). Every rank must use the same.
  std::optional<uint64_t> rdMaxBytes;
  // GFLOW_HD_MAX_BYTES: allreduces above rdMaxBytes and up to this size use
  // halving-doubling, larger ones ring (unset there: a per world size
  // default). Every rank must use the same.
  std::optional<uint64_t> hdMaxBytes;
  // GFLOW_CODEC_PIECE: a compressed allreduce of host data of 1.5 times this
  // or more runs as consecutive pieces of about this many float32 bytes,
  // each piece's conversions beside another's wire time (65536 to 2^40; 0:
  // one piece). Every rank must use the same.
  std::optional<uint64_t> codecPieceBytes;
  // GFLOW_HIER_SEGMENT: pipelined segment of the hierarchical allreduce (>= 4096).
  std::optional<uint64_t> hierSegmentBytes;
  // GFLOW_MODEL: a cost model file (allreduce_bw --calibrate FILE); the flat
  // allreduce then takes the algorithm it predicts fastest, unless
  // rdMaxBytes/hdMaxBytes or an algorithm rule say otherwise. Every rank
  // must load the same parameters.
  std::string modelFile;
};

// CUDA tensors. Every rank of a communicator must use the same values.
struct DeviceOptions {
  std::string backend;            // GFLOW_DEVICE_BACKEND: "auto", "nccl" or "staged"
  std::optional<bool> verifyOps;  // GFLOW_NCCL_VERIFY: check each NCCL op's match beside it
  // GFLOW_NCCL_P2P: point-to-point on cuda tensors through NCCL (docs/backends.md)
  std::optional<bool> p2p;
};

// How a rank waits and where its progress thread runs.
struct ProgressOptions {
  // GFLOW_UNEXPECTED_LIMIT: bytes a peer may send ahead of the matching
  // receive (>= 1).
  std::optional<uint64_t> unexpectedLimitBytes;
  // GFLOW_SPIN_US: microseconds a waiting rank polls (yielding the core
  // between polls) before it sleeps (>= 0; unset there: auto, 1000 when the
  // host's ranks fit its cpus, else 100).
  std::optional<int> spinUs;
  std::optional<bool> pinThreads;  // GFLOW_PIN: pin the progress thread near the NIC
  // GFLOW_PROGRESS_PRIORITY: nice levels the progress thread runs above the
  // thread that starts it (-39..39; 0: the same). Raising needs CAP_SYS_NICE
  // or RLIMIT_NICE; without, the thread keeps its level and a warning says so.
  std::optional<int> priority;
};

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

  // Network transport between hosts (GFLOW_TRANSPORT): "tcp" (the default)
  // or "verbs". Ranks of one host use shared memory unless shm.enabled is
  // false (GFLOW_SHM=0).
  std::string transport;
  // GFLOW_CONNECT: which peers the network transport (TCP or verbs) connects
  // to: "all" (every peer at init), "lazy" (a peer when an op first needs
  // it) or "auto" (all up to 64 ranks); every rank alike.
  std::string connect;
  TcpOptions tcp;
  VerbsOptions verbs;
  ShmOptions shm;
  ProgressOptions progress;

  // Algorithm override, same syntax as GFLOW_ALGO (docs/algorithms.md),
  // e.g. "ring" or "allreduce:0-64k:rd,allreduce:64k-:ring".
  std::string algorithm;
  TuningOptions tuning;

  DeviceOptions device;

  // Reproducible mode (GFLOW_REPRODUCIBLE; docs/algorithms.md): allreduce and
  // reduce-scatter reduce every element by one fixed tree over the ranks
  // (for four: (x0 + x1) + (x2 + x3)), in float32 for float16, bfloat16 and float8 and in the
  // element type otherwise, so the result's bits do not depend on how the work is cut (buckets,
  // fusion, algorithm, chunk sizes, sockets, which ranks share a host) nor on host or device
  // buffers. Every rank must use the same value.
  std::optional<bool> reproducible;
};

}  // namespace gflow
