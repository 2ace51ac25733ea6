// libgflow_cuda.so's full table (plugin.h): its runtime table (cuda/runtime.cu)
// extended by the kernels of kernels.cu.
#include "kernels/cuda/plugin.h"

namespace gflow::cuda {
namespace {

Plugin makeTable() {
  Plugin t;
  static_cast<Runtime&>(t) = *gflow_cuda_runtime();
  t.batchedCopy = kernels::cuda::batchedCopy;
  t.narrow = kernels::cuda::narrow;
  t.widen = kernels::cuda::widen;
  t.scale = kernels::cuda::scale;
  t.flagNonFinite = kernels::cuda::flagNonFinite;
  t.accumulateChunkNorms = kernels::cuda::accumulateChunkNorms;
  t.topChunksTempBytes = kernels::cuda::topChunksTempBytes;
  t.topChunks = kernels::cuda::topChunks;
  t.gatherChunks = kernels::cuda::gatherChunks;
  t.scatterChunks = kernels::cuda::scatterChunks;
  return t;
}

}  // namespace
}  // namespace gflow::cuda

extern "C" __attribute__((visibility("default"))) const gflow::cuda::Plugin* gflow_cuda_plugin() {
  static const gflow::cuda::Plugin table = gflow::cuda::makeTable();
  return &table;
}
