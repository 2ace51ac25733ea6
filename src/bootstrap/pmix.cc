// The PMIx client: libpmix.so.2 is dlopened on first use (its types come from
// <pmix.h> at build time only), PMIx_Init runs once per process and
// PMIx_Finalize at exit, so the launcher sees a clean disconnect.
#include "bootstrap/pmix.h"

#include <dlfcn.h>
#include <pmix.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/check.h"
#include "common/logging.h"

namespace gflow::bootstrap::pmix {
namespace {

const ErrorContext kCtx = ErrorContext::forOp("bootstrap");
constexpr const char* kLibraries[] = {"libpmix.so.2", "libpmix.so"};
constexpr size_t kMaxValueBytes = 4096;  // a host:port and a token fit many times

struct Api {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Put) put = nullptr;
  decltype(&PMIx_Commit) commit = nullptr;
  decltype(&PMIx_Fence) fence = nullptr;
  decltype(&PMIx_Error_string) errorString = nullptr;
  decltype(&PMIx_Value_destruct) valueDestruct = nullptr;  // absent before PMIx 4: values leak
};

template <typename F>
void bind(void* handle, const char* name, F* slot, bool required) {
  *slot = reinterpret_cast<F>(dlsym(handle, name));
  if (*slot == nullptr && required) {
    GFLOW_THROW(kInvalidArgument, kCtx) << "the PMIx library lacks " << name << ": it is too old "
                                        << "for gflow (PMIx 3 or newer is needed)";
  }
}

Api load() {
  void* handle = nullptr;
  std::string errors;
  for (const char* lib : kLibraries) {
    // RTLD_GLOBAL: libpmix's own plugins resolve its symbols from it.
    handle = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (handle != nullptr) break;
    const char* why = dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (why ? why : lib);
  }
  if (handle == nullptr) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "this process was started by a PMIx launcher (PMIX_NAMESPACE is set) but libpmix "
           "cannot be loaded ("
        << errors << "): install libpmix2, or give the rank 0 address (GFLOW_ROOT) yourself";
  }
  Api api;
  bind(handle, "PMIx_Init", &api.init, true);
  bind(handle, "PMIx_Finalize", &api.finalize, true);
  bind(handle, "PMIx_Get", &api.get, true);
  bind(handle, "PMIx_Put", &api.put, true);
  bind(handle, "PMIx_Commit", &api.commit, true);
  bind(handle, "PMIx_Fence", &api.fence, true);
  bind(handle, "PMIx_Error_string", &api.errorString, true);
  bind(handle, "PMIx_Value_destruct", &api.valueDestruct, false);
  return api;
}

void setKey(pmix_info_t* info, const char* key) {
  std::memset(info, 0, sizeof(*info));
  std::strncpy(info->key, key, PMIX_MAX_KEYLEN);
}

pmix_info_t flagInfo(const char* key) {
  pmix_info_t info;
  setKey(&info, key);
  info.value.type = PMIX_BOOL;
  info.value.data.flag = true;
  return info;
}

pmix_info_t timeoutInfo(std::chrono::milliseconds timeout) {
  pmix_info_t info;
  setKey(&info, PMIX_TIMEOUT);
  info.value.type = PMIX_INT;
  // Whole seconds, at least one (0 would mean "wait forever").
  const int64_t s = (timeout.count() + 999) / 1000;
  info.value.data.integer = static_cast<int>(s < 1 ? 1 : (s > 1000000 ? 1000000 : s));
  return info;
}

// A value returned by PMIx_Get, released with it.
struct ValueDeleter {
  const Api* api;
  void operator()(pmix_value_t* v) const {
    if (v == nullptr) return;
    if (api->valueDestruct != nullptr) {
      api->valueDestruct(v);
      std::free(v);
    }
  }
};
using Value = std::unique_ptr<pmix_value_t, ValueDeleter>;

bool toInt(const pmix_value_t& v, int64_t* out) {
  switch (v.type) {
    case PMIX_UINT8: *out = v.data.uint8; return true;
    case PMIX_UINT16: *out = v.data.uint16; return true;
    case PMIX_UINT32: *out = v.data.uint32; return true;
    case PMIX_UINT64:
      *out = static_cast<int64_t>(v.data.uint64 > INT32_MAX ? -1 : v.data.uint64);
      return true;
    case PMIX_INT: *out = v.data.integer; return true;
    case PMIX_INT8: *out = v.data.int8; return true;
    case PMIX_INT16: *out = v.data.int16; return true;
    case PMIX_INT32: *out = v.data.int32; return true;
    case PMIX_INT64: *out = v.data.int64; return true;
    case PMIX_SIZE:
      *out = static_cast<int64_t>(v.data.size > INT32_MAX ? -1 : v.data.size);
      return true;
    case PMIX_PROC_RANK: *out = v.data.rank; return true;
    default: return false;
  }
}

// The connected client, one per process.
class Client {
 public:
  static Client& instance() {
    static std::mutex mu;
    static std::unique_ptr<Client> client;  // destroyed at exit: PMIx_Finalize
    std::lock_guard<std::mutex> lock(mu);
    if (!client) client.reset(new Client());
    return *client;
  }

  // A forked child that exits must not disconnect its parent's client.
  ~Client() {
    if (::getpid() == pid_) api_.finalize(nullptr, 0);
  }

  const pmix_proc_t& self() const { return self_; }

  std::string describe(pmix_status_t rc) const {
    const char* s = api_.errorString(rc);
    return std::string(s ? s : "unknown PMIx status") + " (" + std::to_string(rc) + ")";
  }

  // PMIx_Get of `key` for `rank` (PMIX_RANK_WILDCARD: the job); null when
  // the server has no such value.
  // `local`: a value the server gave at init (PMIX_OPTIONAL: not asked for
  // again, so a key an older server lacks costs no wait).
  Value get(pmix_rank_t rank, const char* key, std::chrono::milliseconds timeout,
            pmix_status_t* status, bool local = false) {
    std::lock_guard<std::mutex> lock(mu_);
    pmix_proc_t proc = self_;
    proc.rank = rank;
    pmix_info_t info[2] = {timeoutInfo(timeout), flagInfo(PMIX_OPTIONAL)};
    pmix_value_t* v = nullptr;
    *status = api_.get(&proc, key, info, local ? 2 : 1, &v);
    Value out(v, ValueDeleter{&api_});
    if (*status != PMIX_SUCCESS) out.reset();
    return out;
  }

  std::string share(const std::string& key, const std::string& rootValue,
                    std::chrono::milliseconds timeout) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (self_.rank == 0) publish(key, rootValue);
      pmix_info_t info[2] = {flagInfo(PMIX_COLLECT_DATA), timeoutInfo(timeout)};
      pmix_status_t rc = api_.fence(nullptr, 0, info, 2);  // every process of the job
      failOn(rc, "PMIx_Fence (waiting for every rank of the job to reach gflow's setup)");
    }
    pmix_status_t rc = PMIX_SUCCESS;
    Value v = get(0, key.c_str(), timeout, &rc);
    failOn(rc, "PMIx_Get of rank 0's " + key);
    if (!v || v->type != PMIX_STRING || v->data.string == nullptr ||
        std::strlen(v->data.string) > kMaxValueBytes) {
      GFLOW_THROW(kInvalidArgument, kCtx) << "rank 0's " << key << " from the PMIx server is not "
                                          << "a string of at most " << kMaxValueBytes << " bytes";
    }
    return v->data.string;
  }

 private:
  Client() : api_(load()), pid_(::getpid()) {
    pmix_status_t rc = api_.init(&self_, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      GFLOW_THROW(kInvalidArgument, kCtx)
          << "PMIx_Init failed: " << describe(rc)
          << "; the launcher's PMIx server cannot be reached (give the rank 0 address with "
             "GFLOW_ROOT to bootstrap without it)";
    }
  }

  void publish(const std::string& key, const std::string& value) {
    pmix_value_t v;
    std::memset(&v, 0, sizeof(v));
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());  // PMIx_Put copies it
    failOn(api_.put(PMIX_GLOBAL, key.c_str(), &v), "PMIx_Put of " + key);
    failOn(api_.commit(), "PMIx_Commit");
  }

  void failOn(pmix_status_t rc, const std::string& what) const {
    if (rc == PMIX_SUCCESS) return;
    if (rc == PMIX_ERR_TIMEOUT) {
      GFLOW_THROW(kTimeout, kCtx) << what << " timed out: " << describe(rc);
    }
    GFLOW_THROW(kInvalidArgument, kCtx) << what << " failed: " << describe(rc);
  }

  Api api_;
  pid_t pid_;
  pmix_proc_t self_{};
  std::mutex mu_;
};

int intOf(Client& c, pmix_rank_t rank, const char* key, const char* what, bool required) {
  pmix_status_t rc = PMIX_SUCCESS;
  Value v = c.get(rank, key, std::chrono::seconds(10), &rc, /*local=*/true);
  int64_t x = -1;
  if (!v || !toInt(*v, &x) || x < 0 || x > INT32_MAX) {
    if (!required) return -1;
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "the PMIx server does not give this process's " << what << " (" << key << ": "
        << (v ? "not a non-negative integer" : c.describe(rc)) << ")";
  }
  return static_cast<int>(x);
}

}  // namespace

bool launched() {
  const char* ns = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  return ns != nullptr && *ns != '\0' && rank != nullptr && *rank != '\0';
}

Job job() {
  Client& c = Client::instance();
  Job j;
  j.rank = static_cast<int>(c.self().rank);
  j.size = intOf(c, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, "job size", true);
  j.localRank = intOf(c, c.self().rank, PMIX_LOCAL_RANK, "local rank", false);
  j.localSize = intOf(c, PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE, "local size", false);
  pmix_status_t rc = PMIX_SUCCESS;
  Value host = c.get(c.self().rank, PMIX_HOSTNAME, std::chrono::seconds(10), &rc, true);
  if (host && host->type == PMIX_STRING && host->data.string != nullptr &&
      std::strlen(host->data.string) <= 255) {
    j.host = host->data.string;
  }
  GFLOW_LOG(DEBUG) << "PMIx: rank " << j.rank << " of " << j.size << ", local " << j.localRank
                   << " of " << j.localSize << ", host '" << j.host << "'";
  return j;
}

std::string shareFromRankZero(const std::string& key, const std::string& rootValue,
                              std::chrono::milliseconds timeout) {
  return Client::instance().share(key, rootValue, timeout);
}

}  // namespace gflow::bootstrap::pmix
