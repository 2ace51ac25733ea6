// cuda::load (plugin.h): the kernel table of the component the CUDA layer's
// loader opened.
#include <atomic>
#include <string>

#include "cuda/loader.h"
#include "kernels/cuda/plugin.h"

namespace gflow::cuda {
namespace {

struct Found {
  const Plugin* plugin = nullptr;
  std::string why;
};

Found find() {
  Found out;
  if (!loadRuntime(&out.why)) return out;
  using Entry = const Plugin* (*)();
  auto entry = reinterpret_cast<Entry>(componentSymbol("gflow_cuda_plugin"));
  const Plugin* p = entry ? entry() : nullptr;
  if (!p || p->abi != kComponentAbi) {
    out.why = "gflow's CUDA component has no kernel table of ABI " + std::to_string(kComponentAbi);
    return out;
  }
  out.plugin = p;
  return out;
}

std::atomic<const Plugin*> testPlugin{nullptr};

}  // namespace

void installPluginForTesting(const Plugin* p) {
  testPlugin.store(p);
  installRuntimeForTesting(p);
}

const Plugin* load(std::string* why) {
  if (const Plugin* t = testPlugin.load()) return t;
  static const Found f = find();
  if (!f.plugin && why) *why = f.why;
  return f.plugin;
}

}  // namespace gflow::cuda
