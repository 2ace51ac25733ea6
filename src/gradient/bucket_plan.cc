#include "gradient/bucket_plan.h"

#include <algorithm>

#include "common/check.h"

namespace gflow::gradient {

namespace {

// Sets inPlace/start when the bucket's non-empty tensors are adjacent in
// memory in bucket order.
void markInPlace(Bucket& b, const std::vector<Tensor>& tensors) {
  const char* next = nullptr;
  for (size_t i : b.tensors) {
    const Tensor& t = tensors[i];
    if (t.count == 0) continue;
    const char* at = static_cast<const char*>(t.data);
    if (!at || (next && at != next)) return;
    if (!next) b.start = t.data;
    next = at + t.nbytes();
  }
  b.inPlace = b.start != nullptr || b.bytes == 0;
}

}  // namespace

BucketPlan planBuckets(const std::vector<Tensor>& tensors, uint64_t threshold,
                       uint64_t float32Threshold) {
  std::vector<size_t> all(tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return planSubset(tensors, threshold, all, float32Threshold);
}

BucketPlan planSubset(const std::vector<Tensor>& tensors, uint64_t threshold,
                      const std::vector<size_t>& indices, uint64_t float32Threshold) {
  GFLOW_ENFORCE(threshold > 0);
  BucketPlan plan;
  plan.bucketOf.assign(tensors.size(), SIZE_MAX);
  // One open bucket per dtype; a bucket takes its place in the firing order
  // when it closes.
  std::vector<Bucket> open(kNumDataTypes);
  auto close = [&](Bucket& b) {
    if (b.tensors.empty()) return;
    markInPlace(b, tensors);
    for (size_t t : b.tensors) plan.bucketOf[t] = plan.buckets.size();
    plan.buckets.push_back(std::move(b));
    b = Bucket{};
  };
  auto add = [&](size_t i) {
    const Tensor& t = tensors[i];
    const uint64_t bytes = t.nbytes();
    const uint64_t limit =
        t.dtype == DataType::kFloat32 && float32Threshold > 0 ? float32Threshold : threshold;
    if (bytes >= limit) {
      Bucket d;
      d.dtype = t.dtype;
      d.tensors = {i};
      d.offsets = {0};
      d.bytes = bytes;
      d.direct = true;
      close(d);
      return;
    }
    Bucket& b = open[static_cast<int>(t.dtype)];
    b.dtype = t.dtype;
    b.tensors.push_back(i);
    b.offsets.push_back(b.bytes);
    b.bytes += bytes;
    if (b.bytes >= limit) close(b);
  };
  for (size_t i : indices) add(i);
  // The partly filled buckets, by their first tensor's position.
  std::vector<Bucket*> rest;
  for (auto& b : open) {
    if (!b.tensors.empty()) rest.push_back(&b);
  }
  std::sort(rest.begin(), rest.end(),
            [](const Bucket* a, const Bucket* b) { return a->tensors[0] < b->tensors[0]; });
  for (Bucket* b : rest) close(*b);
  return plan;
}

}  // namespace gflow::gradient
