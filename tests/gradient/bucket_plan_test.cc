// Bucket planning and fusion packing: deterministic buckets of about the
// threshold, one dtype each, big tensors on their own, and exact round trips.
#include <gtest/gtest.h>

#include <numeric>

#include "gradient/bucket_plan.h"
#include "gradient/fusion.h"

namespace gflow::gradient {
namespace {

std::vector<Tensor> shapes(const std::vector<std::pair<size_t, DataType>>& list) {
  std::vector<Tensor> out;
  for (auto& [count, dtype] : list) out.emplace_back(nullptr, count, dtype);
  return out;
}

TEST(BucketPlan, CutsInOrderAtTheThreshold) {
  // 100-byte float32 tensors (25 elements), threshold 250 bytes: buckets close
  // once they reach it (3 tensors = 300 bytes).
  auto t = shapes(std::vector<std::pair<size_t, DataType>>(7, {25, DataType::kFloat32}));
  BucketPlan p = planBuckets(t, 250);
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_EQ(p.buckets[0].tensors, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(p.buckets[1].tensors, (std::vector<size_t>{3, 4, 5}));
  EXPECT_EQ(p.buckets[2].tensors, (std::vector<size_t>{6}));
  EXPECT_EQ(p.buckets[0].offsets, (std::vector<uint64_t>{0, 100, 200}));
  EXPECT_EQ(p.buckets[0].bytes, 300u);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(p.bucketOf[i], i / 3);
}

TEST(BucketPlan, BigTensorsGoDirectAndDtypesNeverMix) {
  auto t = shapes({{10, DataType::kFloat32},
                   {1000, DataType::kFloat32},  // 4000 bytes >= threshold: direct
                   {10, DataType::kFloat64},
                   {10, DataType::kFloat32},
                   {120, DataType::kFloat64}});  // 960 bytes: closes the float64 bucket
  BucketPlan p = planBuckets(t, 1000);
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_TRUE(p.buckets[0].direct);
  EXPECT_EQ(p.buckets[0].tensors, (std::vector<size_t>{1}));
  EXPECT_EQ(p.buckets[1].dtype, DataType::kFloat64);
  EXPECT_FALSE(p.buckets[1].direct);
  EXPECT_EQ(p.buckets[1].tensors, (std::vector<size_t>{2, 4}));
  EXPECT_EQ(p.buckets[2].dtype, DataType::kFloat32);
  EXPECT_EQ(p.buckets[2].tensors, (std::vector<size_t>{0, 3}));
  EXPECT_EQ(p.buckets[2].offsets, (std::vector<uint64_t>{0, 40}));
}

TEST(BucketPlan, SubsetKeepsItsOrderAndEmptyTensorsStayPlanned) {
  auto t = shapes(
      {{4, DataType::kInt32}, {0, DataType::kInt32}, {4, DataType::kInt32}, {4, DataType::kInt32}});
  BucketPlan p = planSubset(t, 1 << 20, {1, 3});
  ASSERT_EQ(p.buckets.size(), 1u);
  EXPECT_EQ(p.buckets[0].tensors, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(p.buckets[0].bytes, 16u);
  EXPECT_EQ(p.bucketOf[0], SIZE_MAX);
  EXPECT_TRUE(planSubset(t, 1 << 20, {}).buckets.empty());
}

TEST(BucketPlan, Float32CanHaveItsOwnThreshold) {
  // CSC plans float32 buckets at threshold / density; other dtypes keep the
  // dense threshold.
  auto t = shapes({{100, DataType::kFloat32},
                   {100, DataType::kFloat64},
                   {100, DataType::kFloat32},
                   {100, DataType::kFloat64},
                   {500, DataType::kFloat32}});
  BucketPlan p = planBuckets(t, 800, 4000);
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_EQ(p.buckets[0].tensors, (std::vector<size_t>{1}));  // 800 bytes: direct
  EXPECT_TRUE(p.buckets[0].direct);
  EXPECT_EQ(p.buckets[1].tensors, (std::vector<size_t>{3}));
  EXPECT_EQ(p.buckets[2].tensors, (std::vector<size_t>{0, 2, 4}));  // 2800 bytes < 4000
  EXPECT_FALSE(p.buckets[2].direct);
}

TEST(Fusion, PackUnpackRoundTripsEveryByte) {
  std::vector<std::vector<double>> data = {{1, 2, 3}, {}, {4.5}, {6, 7}};
  std::vector<Tensor> t;
  for (auto& d : data) t.emplace_back(d.data(), d.size(), DataType::kFloat64);
  BucketPlan p = planBuckets(t, 1 << 20);
  ASSERT_EQ(p.buckets.size(), 1u);
  std::vector<double> buf(6, -1);
  pack(p.buckets[0], t, buf.data());
  EXPECT_EQ(buf, (std::vector<double>{1, 2, 3, 4.5, 6, 7}));
  for (double& v : buf) v *= 10;
  unpack(p.buckets[0], buf.data(), t);
  EXPECT_EQ(data[0], (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(data[2], (std::vector<double>{45}));
  EXPECT_EQ(data[3], (std::vector<double>{60, 70}));
}

}  // namespace
}  // namespace gflow::gradient
