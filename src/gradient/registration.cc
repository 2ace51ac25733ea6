#include "gradient/registration.h"

#include <algorithm>

#include "common/check.h"
#include "common/params.h"
#include "core/internal.h"
#include "gradient/tensor_device.h"
#include "kernels/cuda/plugin.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

namespace {

constexpr const char* kOp = "reducer.create";
constexpr uint64_t kAbsent = ~uint64_t(0);

// One tensor's signature: count and dtype.
uint64_t signature(const Tensor& t) {
  return (static_cast<uint64_t>(t.count) << 8) | static_cast<uint64_t>(t.dtype);
}

std::string describeSignature(uint64_t s) {
  if (s == kAbsent) return "no tensor";
  return std::to_string(s >> 8) + " x " + toString(static_cast<DataType>(s & 0xff));
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

std::vector<int64_t> allgatherWords(Communicator& comm, std::vector<int64_t> mine) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(Tensor(mine.data(), mine.size(), DataType::kInt64),
                 Tensor(all.data(), all.size(), DataType::kInt64));
  return all;
}

}  // namespace

std::string describeTensor(size_t index, const std::vector<Tensor>& tensors,
                           const std::vector<std::string>& names) {
  std::string s = "tensor " + std::to_string(index);
  if (index >= tensors.size()) return s;
  s += " (";
  if (index < names.size() && !names[index].empty()) s += "'" + names[index] + "', ";
  return s + describeSignature(signature(tensors[index])) + ")";
}

void checkRegistration(Communicator& comm, const std::vector<Tensor>& tensors,
                       const std::vector<std::string>& names, const RegistrationOptions& options) {
  const int size = comm.size();
  const ErrorContext ctx = ErrorContext::forOp(kOp).withRank(comm.rank());
  uint64_t h = 0;
  for (const Tensor& t : tensors) h = mix(h, signature(t));
  // Summary: tensor count, list hash, op, threshold, cycle time.
  std::vector<int64_t> mine = {static_cast<int64_t>(tensors.size()),
                               static_cast<int64_t>(h),
                               static_cast<int64_t>(options.op),
                               static_cast<int64_t>(options.threshold),
                               options.cycleMs,
                               options.compression};
  const size_t w = mine.size();
  const std::vector<int64_t> all = allgatherWords(comm, mine);
  int bad = -1;
  for (int r = 1; r < size && bad < 0; ++r) {
    if (!std::equal(all.begin(), all.begin() + w, all.begin() + r * w)) bad = r;
  }
  if (bad < 0) return;
  auto at = [&](int r, size_t k) { return all[static_cast<size_t>(r) * w + k]; };
  // Every rank saw the same summaries, so every rank takes this path.
  for (int r = 1; r < size; ++r) {
    if (at(r, 5) != at(0, 5)) {
      GFLOW_THROW(kMismatch, ctx) << "GradientReducer wire/CSC settings (wire type, prescale, "
                                     "postscale, density, chunk, momentum, warm-up, "
                                     "reproducible) differ "
                                     "between rank 0 and rank "
                                  << r;
    }
    if (at(r, 2) != at(0, 2) || at(r, 3) != at(0, 3) || at(r, 4) != at(0, 4)) {
      GFLOW_THROW(kMismatch, ctx) << "GradientReducer options differ across ranks: rank 0 has op "
                                  << toString(static_cast<ReduceOp>(at(0, 2)))
                                  << ", fusion threshold " << at(0, 3) << " bytes, cycle time "
                                  << at(0, 4) << " ms; rank " << r << " has op "
                                  << toString(static_cast<ReduceOp>(at(r, 2)))
                                  << ", fusion threshold " << at(r, 3) << " bytes, cycle time "
                                  << at(r, 4) << " ms";
    }
  }
  // The lists differ: gather them (padded to the longest) to name the first
  // tensor that differs.
  int64_t longest = 0;
  for (int r = 0; r < size; ++r) longest = std::max(longest, at(r, 0));
  std::vector<int64_t> list(static_cast<size_t>(longest), static_cast<int64_t>(kAbsent));
  for (size_t i = 0; i < tensors.size(); ++i) list[i] = static_cast<int64_t>(signature(tensors[i]));
  const std::vector<int64_t> lists = allgatherWords(comm, list);
  const auto sig = [&](int r, size_t i) {
    return static_cast<uint64_t>(lists[static_cast<size_t>(r) * list.size() + i]);
  };
  for (size_t i = 0; i < list.size(); ++i) {
    for (int r = 1; r < size; ++r) {
      if (sig(r, i) == sig(0, i)) continue;
      std::string mineText = i < tensors.size() ? describeTensor(i, tensors, names)
                                                : "tensor " + std::to_string(i) + " (none)";
      GFLOW_THROW(kMismatch, ctx) << "GradientReducer registrations differ across ranks at tensor "
                                  << i << ": rank 0 "
                                  << "registered " << describeSignature(sig(0, i)) << ", rank " << r
                                  << " registered " << describeSignature(sig(r, i))
                                  << " (here on rank " << comm.rank() << ": " << mineText
                                  << "); ranks registered " << at(0, 0) << " and " << at(r, 0)
                                  << " tensors";
    }
  }
  GFLOW_THROW(kMismatch, ctx) << "GradientReducer registrations differ across ranks (rank " << bad
                              << " vs rank 0)";
}

uint64_t thresholdOr(Communicator& comm, const char* op, uint64_t given) {
  const uint64_t t = given > 0 ? given : params::fusionThreshold();
  if (t == 0) CommunicatorAccess::failInvalid(comm, op, "GFLOW_FUSION_THRESHOLD must be > 0");
  return t;
}

void validateTensors(Communicator& comm, const char* op, const std::vector<Tensor>& tensors,
                     const std::vector<std::string>& names) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& x = tensors[i];
    const char* why = static_cast<int>(x.dtype) >= kNumDataTypes ? "has an invalid dtype"
                      : x.device.type != DeviceType::kCPU && x.device.type != DeviceType::kCUDA
                          ? "has an invalid device type"
                      : x.count > 0 && !x.data ? "has null data"
                                               : nullptr;
    if (why) {
      CommunicatorAccess::failInvalid(comm, op, describeTensor(i, tensors, names) + " " + why);
    }
  }
  // Cuda gradients: the CUDA component, one GPU and stream, their memory.
  if (std::any_of(tensors.begin(), tensors.end(),
                  [](const Tensor& t) { return t.device.type == DeviceType::kCUDA; })) {
    std::string why;
    const cuda::Plugin* plugin = cuda::load(&why);
    if (!plugin)
      CommunicatorAccess::failInvalid(comm, op, "the gradients are cuda tensors, but " + why);
    if (gradient::commonDevice(plugin, tensors, names, &why) == -2) {
      CommunicatorAccess::failInvalid(comm, op, why);
    }
  }
  // Overlapping tensors would be reduced twice (or packed over each other).
  std::vector<std::pair<const char*, size_t>> spans;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].count > 0) spans.emplace_back(static_cast<const char*>(tensors[i].data), i);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const size_t prev = spans[k - 1].second;
    if (spans[k - 1].first + tensors[prev].nbytes() > spans[k].first) {
      CommunicatorAccess::failInvalid(comm, op,
                                      describeTensor(prev, tensors, names) + " and " +
                                          describeTensor(spans[k].second, tensors, names) +
                                          " overlap in memory");
    }
  }
}

}  // namespace gflow::gradient
