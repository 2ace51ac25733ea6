// The NCCL table (nccl_api.h) inside gflow's CUDA component: libnccl.so.2 is
// dlopened on the first call, so the component loads (and stages device
// tensors) where NCCL is not installed. Built against nccl.h when CMake found
// NCCL (GFLOW_HAVE_NCCL); without it the table reports why it is missing.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "cuda/nccl_api.h"
#include "gflow/types.h"

#if GFLOW_HAVE_NCCL
#include <nccl.h>
#endif

namespace gflow::cuda {

#if GFLOW_HAVE_NCCL
namespace {

constexpr int kMinVersion = 21800;  // ncclCommSplit, non-blocking communicators

struct Functions {
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclGetLastError) getLastError = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRankConfig) commInitRankConfig = nullptr;
  decltype(&ncclCommSplit) commSplit = nullptr;
  decltype(&ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&ncclCommFinalize) commFinalize = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  decltype(&ncclCommShrink) commShrink = nullptr;  // optional
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
  decltype(&ncclCommRevoke) commRevoke = nullptr;  // optional
#endif
};
Functions f;

bool toNccl(int dtype, ncclDataType_t* out) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kBFloat16: *out = ncclBfloat16; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kFloat8E4M3: *out = ncclFloat8e4m3; return true;
    case DataType::kFloat8E5M2: *out = ncclFloat8e5m2; return true;
    case DataType::kInt16:
    case DataType::kBool:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: break;  // no NCCL type: the NCCL backend stages them
  }
  return false;
}

bool toNccl(int op, ncclRedOp_t* out) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kSum: *out = ncclSum; return true;
    case ReduceOp::kAvg: *out = ncclAvg; return true;
    case ReduceOp::kMin: *out = ncclMin; return true;
    case ReduceOp::kMax: *out = ncclMax; return true;
    case ReduceOp::kProd: *out = ncclProd; return true;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: break;  // no NCCL op: the NCCL backend stages them
  }
  return false;
}

ncclConfig_t nonBlocking() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

const char* errorString(int r) {
  return f.getErrorString(static_cast<ncclResult_t>(r));
}
const char* lastError(void* comm) {
  return f.getLastError(static_cast<ncclComm_t>(comm));
}
int uniqueId(nccl::UniqueId* id) {
  static_assert(sizeof(ncclUniqueId) == sizeof(nccl::UniqueId), "NCCL unique id size");
  ncclUniqueId u;
  const ncclResult_t r = f.getUniqueId(&u);
  std::memcpy(id->bytes, u.internal, sizeof(u.internal));
  return r;
}
int initRank(void** comm, int nranks, const nccl::UniqueId* id, int rank) {
  ncclUniqueId u;
  std::memcpy(u.internal, id->bytes, sizeof(u.internal));
  ncclConfig_t c = nonBlocking();
  ncclComm_t out = nullptr;
  const ncclResult_t r = f.commInitRankConfig(&out, nranks, u, rank, &c);
  *comm = out;
  return r;
}
int split(void* comm, int color, int key, void** out) {
  ncclConfig_t c = nonBlocking();
  ncclComm_t n = nullptr;
  const ncclResult_t r = f.commSplit(static_cast<ncclComm_t>(comm),
                                     color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &n, &c);
  *out = n;
  return r;
}
int asyncError(void* comm, int* result) {
  ncclResult_t a = ncclSuccess;
  const ncclResult_t r = f.commGetAsyncError(static_cast<ncclComm_t>(comm), &a);
  *result = a;
  return r;
}
int finalize(void* comm) {
  return f.commFinalize(static_cast<ncclComm_t>(comm));
}
int destroy(void* comm) {
  return f.commDestroy(static_cast<ncclComm_t>(comm));
}
int abortComm(void* comm) {
  return f.commAbort(static_cast<ncclComm_t>(comm));
}
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
int shrink(void* comm, const int* excluded, int count, void** out, bool abortOngoing) {
  ncclConfig_t c = nonBlocking();
  ncclComm_t n = nullptr;
  const ncclResult_t r =
      f.commShrink(static_cast<ncclComm_t>(comm), const_cast<int*>(excluded), count, &n, &c,
                   abortOngoing ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
  *out = n;
  return r;
}
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
int revoke(void* comm) {
  return f.commRevoke(static_cast<ncclComm_t>(comm), NCCL_REVOKE_DEFAULT);
}
#endif
// The operands in NCCL's types; false when gflow's have no NCCL equal.
bool toNccl(const nccl::Collective& c, ncclDataType_t* t, ncclRedOp_t* o) {
  return toNccl(c.dtype, t) && toNccl(c.op, o);
}
int allReduce(const nccl::Collective& c, void* comm, void* s) {
  ncclDataType_t t;
  ncclRedOp_t o;
  if (!toNccl(c, &t, &o)) return ncclInvalidArgument;
  return f.allReduce(c.in, c.out, c.count, t, o, static_cast<ncclComm_t>(comm),
                     static_cast<cudaStream_t>(s));
}
int reduceScatter(const nccl::Collective& c, void* comm, void* s) {
  ncclDataType_t t;
  ncclRedOp_t o;
  if (!toNccl(c, &t, &o)) return ncclInvalidArgument;
  return f.reduceScatter(c.in, c.out, c.count, t, o, static_cast<ncclComm_t>(comm),
                         static_cast<cudaStream_t>(s));
}
int allGather(const nccl::Collective& c, void* comm, void* s) {
  ncclDataType_t t;
  if (!toNccl(c.dtype, &t)) return ncclInvalidArgument;
  return f.allGather(c.in, c.out, c.count, t, static_cast<ncclComm_t>(comm),
                     static_cast<cudaStream_t>(s));
}
int broadcast(const nccl::Collective& c, void* comm, void* s) {
  ncclDataType_t t;
  if (!toNccl(c.dtype, &t)) return ncclInvalidArgument;
  return f.broadcast(c.in, c.out, c.count, t, c.root, static_cast<ncclComm_t>(comm),
                     static_cast<cudaStream_t>(s));
}
int reduce(const nccl::Collective& c, void* comm, void* s) {
  ncclDataType_t t;
  ncclRedOp_t o;
  if (!toNccl(c, &t, &o)) return ncclInvalidArgument;
  return f.reduce(c.in, c.out, c.count, t, o, c.root, static_cast<ncclComm_t>(comm),
                  static_cast<cudaStream_t>(s));
}
int send(const void* buf, size_t n, int dtype, int peer, void* comm, void* s) {
  ncclDataType_t t;
  if (!toNccl(dtype, &t)) return ncclInvalidArgument;
  return f.send(buf, n, t, peer, static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(s));
}
int recv(void* buf, size_t n, int dtype, int peer, void* comm, void* s) {
  ncclDataType_t t;
  if (!toNccl(dtype, &t)) return ncclInvalidArgument;
  return f.recv(buf, n, t, peer, static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(s));
}
int groupStart() {
  return f.groupStart();
}
int groupEnd() {
  return f.groupEnd();
}

template <typename T>
bool sym(void* h, const char* name, T* out, std::string* missing) {
  *out = reinterpret_cast<T>(dlsym(h, name));
  if (!*out) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  return *out != nullptr;
}

struct Loaded {
  nccl::Api api;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded l;
  void* h = nullptr;
  std::string errors;
  for (const char* c : {"libnccl.so.2", GFLOW_NCCL_LIBRARY_PATH}) {
    h = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (h) break;
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : c);
  }
  if (!h) {
    l.why = "libnccl.so.2 could not be loaded (" + errors +
            "); install NCCL or add its directory to LD_LIBRARY_PATH";
    return l;
  }
  std::string missing;
  sym(h, "ncclGetVersion", &f.getVersion, &missing);
  sym(h, "ncclGetErrorString", &f.getErrorString, &missing);
  sym(h, "ncclGetLastError", &f.getLastError, &missing);
  sym(h, "ncclGetUniqueId", &f.getUniqueId, &missing);
  sym(h, "ncclCommInitRankConfig", &f.commInitRankConfig, &missing);
  sym(h, "ncclCommSplit", &f.commSplit, &missing);
  sym(h, "ncclCommGetAsyncError", &f.commGetAsyncError, &missing);
  sym(h, "ncclCommFinalize", &f.commFinalize, &missing);
  sym(h, "ncclCommDestroy", &f.commDestroy, &missing);
  sym(h, "ncclCommAbort", &f.commAbort, &missing);
  sym(h, "ncclAllReduce", &f.allReduce, &missing);
  sym(h, "ncclReduceScatter", &f.reduceScatter, &missing);
  sym(h, "ncclAllGather", &f.allGather, &missing);
  sym(h, "ncclBroadcast", &f.broadcast, &missing);
  sym(h, "ncclReduce", &f.reduce, &missing);
  sym(h, "ncclSend", &f.send, &missing);
  sym(h, "ncclRecv", &f.recv, &missing);
  sym(h, "ncclGroupStart", &f.groupStart, &missing);
  sym(h, "ncclGroupEnd", &f.groupEnd, &missing);
  int version = 0;
  if (f.getVersion) f.getVersion(&version);
  if (!missing.empty() || version < kMinVersion) {
    l.why = "the NCCL library found (version " + std::to_string(version) +
            ") is older than 2.18 or lacks " + (missing.empty() ? "nothing" : missing) +
            "; gflow needs NCCL >= 2.18";
    return l;
  }
  nccl::Api& a = l.api;
  a.version = version;
  a.getErrorString = errorString;
  a.getLastError = lastError;
  a.getUniqueId = uniqueId;
  a.commInitRank = initRank;
  a.commSplit = split;
  a.commGetAsyncError = asyncError;
  a.commFinalize = finalize;
  a.commDestroy = destroy;
  a.commAbort = abortComm;
  a.allReduce = allReduce;
  a.reduceScatter = reduceScatter;
  a.allGather = allGather;
  a.broadcast = broadcast;
  a.reduce = reduce;
  a.send = send;
  a.recv = recv;
  a.groupStart = groupStart;
  a.groupEnd = groupEnd;
  // The fault-tolerance calls: optional, by symbol (a library older than
  // the header lacks them).
  [[maybe_unused]] std::string absent;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (sym(h, "ncclCommShrink", &f.commShrink, &absent)) a.commShrink = shrink;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
  if (sym(h, "ncclCommRevoke", &f.commRevoke, &absent)) a.commRevoke = revoke;
#endif
  l.ok = true;
  return l;
}

}  // namespace

const nccl::Api* loadNccl(const char** why) {
  static const Loaded l = load();
  if (!l.ok && why) *why = l.why.c_str();
  return l.ok ? &l.api : nullptr;
}

#else  // !GFLOW_HAVE_NCCL

const nccl::Api* loadNccl(const char** why) {
  if (why) *why = "gflow's CUDA component was built without NCCL (GFLOW_WITH_NCCL)";
  return nullptr;
}

#endif

}  // namespace gflow::cuda
