// Bucket planning for chunk fusion: cuts a list of tensors, in order, into
// buckets of about `threshold` bytes, one dtype per bucket. A tensor of at
// least `threshold` bytes is a bucket of its own, reduced in place ("direct",
// no copy). Deterministic: the same list (counts and dtypes) gives the same
// buckets on every rank; only `inPlace` depends on this rank's addresses.
#pragma once

#include <cstdint>
#include <vector>

#include "gflow/types.h"

namespace gflow::gradient {

struct Bucket {
  DataType dtype = DataType::kFloat32;
  std::vector<size_t> tensors;    // indices into the planned list, ascending
  std::vector<uint64_t> offsets;  // byte offset of each tensor in the fusion buffer
  uint64_t bytes = 0;             // sum of the tensors' bytes
  bool direct = false;            // one tensor, reduced in place
  // The tensors lie back to back in memory (views into one flat gradient
  // buffer, in bucket order): the bucket is reduced in place, no packing.
  // Always true for a direct bucket.
  bool inPlace = false;
  // Where an in-place bucket starts (its first non-empty tensor).
  void* start = nullptr;
};

struct BucketPlan {
  std::vector<Bucket> buckets;   // in firing order
  std::vector<size_t> bucketOf;  // per tensor: its bucket
};

// Plans all of `tensors`, in order. Buckets of one dtype close when they
// reach `threshold` bytes; buckets are ordered by when they close, the
// partly filled ones at the end by their first tensor. threshold must be > 0.
// `float32Threshold` (0: the same) applies to float32 tensors instead (CSC
// plans its float32 buckets larger than the dense ones).
BucketPlan planBuckets(const std::vector<Tensor>& tensors, uint64_t threshold,
                       uint64_t float32Threshold = 0);
// The same for the subset `indices` (ascending) of `tensors`; an empty
// subset gives no buckets. (A name of its own: an overload would let `{}`
// for the indices silently mean "all".)
BucketPlan planSubset(const std::vector<Tensor>& tensors, uint64_t threshold,
                      const std::vector<size_t>& indices, uint64_t float32Threshold = 0);

}  // namespace gflow::gradient
