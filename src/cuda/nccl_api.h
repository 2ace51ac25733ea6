// The NCCL functions the NCCL backend uses, as a table of plain C functions
// that speak gflow's types. The table is filled inside gflow's CUDA
// component (nccl_loader.cu, built with nccl.h), which dlopens libnccl.so.2
// on first use: libgflow never includes nccl.h nor links NCCL, and tests
// install a software NCCL with the same table.
//
// Every entry returns a Result (the numbering of ncclResult_t). Communicators
// are ncclComm_t and streams cudaStream_t, passed as void*.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gflow::nccl {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char bytes[kUniqueIdBytes];
};

enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// One collective's operands. dtype: gflow::DataType, op: gflow::ReduceOp
// (both as int); count as NCCL counts it (reduceScatter: per rank's output,
// allGather: per rank's input); root: broadcast and reduce only.
struct Collective {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  int dtype = 0;
  int op = 0;
  int root = 0;
};

struct Api {
  int version = 0;  // NCCL_VERSION_CODE of the loaded library, e.g. 22809
  const char* (*getErrorString)(int result) = nullptr;
  // NCCL's last error message for `comm` (may be empty).
  const char* (*getLastError)(void* comm) = nullptr;
  int (*getUniqueId)(UniqueId* id) = nullptr;
  // On the current CUDA device. Non-blocking (ncclConfig_t.blocking = 0):
  // the call and later calls on the communicator may return kInProgress;
  // commGetAsyncError says when they are done.
  int (*commInitRank)(void** comm, int nranks, const UniqueId* id, int rank) = nullptr;
  // Collective over every rank of `comm`; color < 0: this rank joins none
  // (NCCL_SPLIT_NOCOLOR, *out is null). Non-blocking as above.
  int (*commSplit)(void* comm, int color, int key, void** out) = nullptr;
  int (*commGetAsyncError)(void* comm, int* result) = nullptr;
  int (*commFinalize)(void* comm) = nullptr;
  int (*commDestroy)(void* comm) = nullptr;
  int (*commAbort)(void* comm) = nullptr;
  // Where the loaded NCCL has them (else null): the fault-tolerance calls.
  // commRevoke (ncclCommRevoke, 2.28.7): ends the in-flight work of `comm`
  // and keeps it for a shrink; collectives on it fail from then on, and
  // commGetAsyncError answers kInProgress until it is quiescent, then
  // kSuccess. commShrink (ncclCommShrink, 2.27): collective over the ranks
  // of `comm` not in `excluded` (its numbering), renumbered in order;
  // non-blocking like split. abortOngoing: NCCL_SHRINK_ABORT (the parent
  // failed: its ongoing work ends first), else NCCL_SHRINK_DEFAULT.
  int (*commRevoke)(void* comm) = nullptr;
  int (*commShrink)(void* comm, const int* excluded, int count, void** out,
                    bool abortOngoing) = nullptr;
  // The collectives, each over every rank of `comm` on `stream`.
  using CollectiveFn = int (*)(const Collective& c, void* comm, void* stream);
  CollectiveFn allReduce = nullptr;
  CollectiveFn reduceScatter = nullptr;
  CollectiveFn allGather = nullptr;
  CollectiveFn broadcast = nullptr;
  CollectiveFn reduce = nullptr;  // `out` is written on `root` only
  // Point-to-point. Between a pair, the k-th send matches the k-th receive.
  // A lone send or receive blocks its stream until its peer's matching call;
  // calls between groupStart and groupEnd progress together (no deadlock
  // however the pairs are ordered). On a non-blocking communicator
  // groupEnd may return kInProgress (commGetAsyncError tells the end).
  int (*send)(const void* buf, size_t count, int dtype, int peer, void* comm,
              void* stream) = nullptr;
  int (*recv)(void* buf, size_t count, int dtype, int peer, void* comm, void* stream) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;
};

}  // namespace gflow::nccl
