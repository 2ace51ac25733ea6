#include "cuda/loader.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/params.h"

namespace gflow::cuda {
namespace {

constexpr const char* kComponent = "libgflow_cuda.so." GFLOW_CUDA_SOVERSION;

struct Loaded {
  void* handle = nullptr;  // the component's, kept open for the process
  const Runtime* runtime = nullptr;
  std::string why;
};

// The directory libgflow itself was loaded from.
std::string ownDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&loadRuntime), &info) == 0 || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// The path setComponentPath gave, and whether the load was tried (after
// which the path can no longer change).
struct PathState {
  std::mutex mutex;
  std::string path;
  bool tried = false;
};
PathState& pathState() {
  static PathState s;
  return s;
}

// The path in force, marking the load as tried.
std::string configuredPath() {
  PathState& s = pathState();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.tried = true;
  return !s.path.empty() ? s.path : params::cudaPlugin();
}

Loaded tryLoad() {
  Loaded out;
  std::vector<std::string> candidates;
  const std::string configured = configuredPath();
  if (!configured.empty()) {
    candidates.push_back(configured);
  } else {
    const std::string dir = ownDirectory();
    if (!dir.empty()) candidates.push_back(dir + kComponent);
    candidates.push_back(kComponent);
  }
  void* h = nullptr;
  std::string errors;
  for (const std::string& c : candidates) {
    h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) break;
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : c);
  }
  if (!h) {
    out.why = std::string("gflow's CUDA component ") + kComponent + " could not be loaded (" +
              errors +
              "); build gflow with the CUDA toolkit (GFLOW_WITH_CUDA) or set GFLOW_CUDA_PLUGIN "
              "(gflow::setCudaComponent)";
    return out;
  }
  using Entry = const Runtime* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(h, "gflow_cuda_runtime"));
  const Runtime* p = entry ? entry() : nullptr;
  if (!p || p->abi != kComponentAbi) {
    out.why = std::string(kComponent) + " is from another gflow version (component ABI " +
              std::to_string(p ? p->abi : 0) + ", expected " + std::to_string(kComponentAbi) + ")";
    return out;
  }
  int n = 0;
  if (int e = p->deviceCount(&n)) {
    out.why = std::string("no usable GPU: ") + p->errorString(e);
    return out;
  }
  if (n == 0) {
    out.why = "no GPU found";
    return out;
  }
  GFLOW_LOG(INFO) << "loaded " << kComponent << " (" << n << " GPU" << (n > 1 ? "s" : "") << ")";
  out.handle = h;
  out.runtime = p;
  return out;
}

const Loaded& loaded() {
  static const Loaded l = tryLoad();
  return l;
}

std::atomic<const Runtime*> testRuntime{nullptr};

}  // namespace

bool setComponentPath(const std::string& path, std::string* why) {
  PathState& s = pathState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.tried) {
    if (why) *why = "the CUDA component was already loaded (or its load tried) in this process";
    return false;
  }
  s.path = path;
  return true;
}

void installRuntimeForTesting(const Runtime* r) {
  testRuntime.store(r);
}

const Runtime* loadRuntime(std::string* why) {
  if (const Runtime* t = testRuntime.load()) return t;
  const Loaded& l = loaded();
  if (!l.runtime && why) *why = l.why;
  return l.runtime;
}

void* componentSymbol(const char* name) {
  const Loaded& l = loaded();
  return l.runtime ? dlsym(l.handle, name) : nullptr;
}

}  // namespace gflow::cuda
