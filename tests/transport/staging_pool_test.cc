// StagingPool (transport/staging_pool.h): a freed buffer serves the next
// message of its size class, sizes stay within 12.5% of what is asked, and
// the pool keeps no more than it may.
#include "transport/staging_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace gflow::transport {
namespace {

TEST(StagingPool, AFreedBufferServesTheNextMessageOfItsClass) {
  StagingPool pool(1 << 20);
  StagingPool::Buffer a = pool.take(100000);
  EXPECT_EQ(a.capacity, size_t{106496});  // 13 x 8 KiB: an eighth of 64 KiB
  std::memset(a.data.get(), 7, 100000);   // all of it is writable
  const char* where = a.data.get();
  pool.give(std::move(a));
  EXPECT_EQ(pool.keptBytes(), size_t{106496});
  StagingPool::Buffer b = pool.take(106496);  // the same class: the same memory
  EXPECT_EQ(b.data.get(), where);
  EXPECT_EQ(pool.keptBytes(), 0u);
  StagingPool::Buffer c = pool.take(106497);  // the next class
  EXPECT_EQ(c.capacity, size_t{114688});
  EXPECT_EQ(pool.keptBytes(), 0u);
}

TEST(StagingPool, CapacityIsWithinAnEighthOfTheSize) {
  StagingPool pool(size_t{1} << 30);
  for (size_t len :
       {size_t{4097}, size_t{65536}, size_t{65537}, size_t{1000000}, size_t{4194305}}) {
    const size_t cap = pool.take(len).capacity;
    EXPECT_GE(cap, len);
    EXPECT_LE(cap, len + len / 8) << len;
  }
}

TEST(StagingPool, SmallAndOversizeMessagesGetExactlyTheirSizeAndAreNotKept) {
  StagingPool pool(1 << 20);
  for (size_t len : {size_t{0}, size_t{1}, size_t{4096}, size_t{2} << 20}) {
    StagingPool::Buffer b = pool.take(len);
    EXPECT_EQ(b.capacity, 0u) << len;
    ASSERT_NE(b.data, nullptr);
    pool.give(std::move(b));
    EXPECT_EQ(pool.keptBytes(), 0u) << len;
  }
}

TEST(StagingPool, KeepsNoMoreThanItsLimit) {
  StagingPool pool(3 * 65536);
  std::vector<StagingPool::Buffer> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.take(65536));
  std::set<const char*> kept;
  for (int i = 0; i < 3; ++i) kept.insert(held[static_cast<size_t>(i)].data.get());
  for (auto& b : held) pool.give(std::move(b));
  EXPECT_EQ(pool.keptBytes(), size_t{3 * 65536});
  // The three kept come back.
  std::vector<StagingPool::Buffer> again;
  for (int i = 0; i < 3; ++i) again.push_back(pool.take(65536));
  for (auto& b : again) EXPECT_EQ(kept.count(b.data.get()), 1u);
  EXPECT_EQ(pool.keptBytes(), 0u);
}

}  // namespace
}  // namespace gflow::transport
