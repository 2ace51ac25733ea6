// StagingPool (transport/staging_pool.h): a freed buffer serves the next
// message of its size class, and the pool keeps no more than it may.
#include "transport/staging_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace gflow::transport {
namespace {

TEST(StagingPool, AFreedBufferServesTheNextMessageOfItsClass) {
  StagingPool pool(1 << 20);
  StagingPool::Buffer a = pool.take(100000);
  EXPECT_EQ(a.capacity, size_t{131072});
  std::memset(a.data.get(), 7, 100000);  // all of it is writable
  const char* where = a.data.get();
  pool.give(std::move(a));
  EXPECT_EQ(pool.keptBytes(), size_t{131072});
  StagingPool::Buffer b = pool.take(131072);  // same class
  EXPECT_EQ(b.data.get(), where);
  EXPECT_EQ(pool.keptBytes(), 0u);
  StagingPool::Buffer c = pool.take(131073);  // the next class: a new one
  EXPECT_EQ(c.capacity, size_t{262144});
  EXPECT_NE(c.data.get(), where);
}

TEST(StagingPool, SmallAndEmptyMessagesTakeTheSmallestClass) {
  StagingPool pool(1 << 20);
  EXPECT_EQ(pool.take(0).capacity, size_t{4096});
  EXPECT_EQ(pool.take(1).capacity, size_t{4096});
  EXPECT_EQ(pool.take(4097).capacity, size_t{8192});
}

TEST(StagingPool, KeepsNoMoreThanItsLimit) {
  StagingPool pool(3 * 65536);
  std::vector<StagingPool::Buffer> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.take(65536));
  for (auto& b : held) pool.give(std::move(b));
  EXPECT_EQ(pool.keptBytes(), size_t{3 * 65536});
  // The kept ones come back; then new ones.
  for (int i = 0; i < 4; ++i) EXPECT_NE(pool.take(65536).data, nullptr);
  EXPECT_EQ(pool.keptBytes(), 0u);
}

}  // namespace
}  // namespace gflow::transport
