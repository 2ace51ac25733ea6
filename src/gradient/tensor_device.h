// Where a reducer's (or an allreduceCoalesced batch's) tensors live: all
// on the host, or all on one GPU and stream.
#pragma once

#include <string>
#include <vector>

#include "gflow/types.h"
#include "kernels/cuda/plugin.h"

namespace gflow::gradient {

// The GPU all `tensors` live on, or -1 when they are all cpu tensors. Sets
// `why` (and returns -2) when they mix devices or streams, or (with a
// `plugin` to ask) a pointer is not memory of the GPU its tensor names.
int commonDevice(const cuda::Plugin* plugin, const std::vector<Tensor>& tensors,
                 const std::vector<std::string>& names, std::string* why);

}  // namespace gflow::gradient
