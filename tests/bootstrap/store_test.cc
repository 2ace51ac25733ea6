// Store semantics shared by every implementation: HashStore, a PrefixStore
// over it, and TcpStore (server and a separate client).
#include "gflow/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "gflow/error.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// Two handles on one store: `a` and `b` are distinct clients where that
// means something (TCP), so every test also crosses connections.
struct StorePair {
  std::shared_ptr<Store> a, b;
  std::function<std::shared_ptr<Store>()> another;  // one more client
};

StorePair makeStore(const std::string& kind) {
  StorePair p;
  if (kind == "hash") {
    p.a = p.b = createHashStore();
    auto s = p.a;
    p.another = [s] { return s; };
  } else if (kind == "prefix") {
    auto base = createHashStore();
    p.a = createPrefixStore("sub", base);
    p.b = createPrefixStore("sub", base);
    p.another = [base] { return createPrefixStore("sub", base); };
  } else {
    TcpStoreOptions o;
    o.isServer = true;
    o.token = "semantics";
    o.timeout = milliseconds(5000);
    auto server = std::make_shared<TcpStore>(o);
    TcpStoreOptions c = o;
    c.isServer = false;
    c.port = server->port();
    p.a = server;
    p.b = std::make_shared<TcpStore>(c);
    p.another = [c, server] { return std::make_shared<TcpStore>(c); };
  }
  return p;
}

class StoreSemanticsTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { s_ = makeStore(GetParam()); }
  StorePair s_;
};

TEST_P(StoreSemanticsTest, SetThenGet) {
  s_.a->set("k", bytes("v1"));
  EXPECT_EQ(s_.b->get("k", milliseconds(1000)), bytes("v1"));
  s_.b->set("k", bytes("v2"));  // overwrite
  EXPECT_EQ(s_.a->get("k", milliseconds(1000)), bytes("v2"));
  s_.a->setString("str", "hello");
  EXPECT_EQ(s_.b->getString("str", milliseconds(1000)), "hello");
}

TEST_P(StoreSemanticsTest, EmptyValueAndBinaryKey) {
  s_.a->set("empty", {});
  EXPECT_TRUE(s_.b->get("empty", milliseconds(1000)).empty());
  std::string key("a\0b\xff", 4);
  s_.a->set(key, bytes("bin"));
  EXPECT_EQ(s_.b->get(key, milliseconds(1000)), bytes("bin"));
  EXPECT_THROW(s_.b->get(std::string("a\0c", 3), milliseconds(0)), Error);
}

TEST_P(StoreSemanticsTest, GetBlocksUntilSet) {
  auto fut = std::async(std::launch::async, [&] { return s_.b->get("late", milliseconds(3000)); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(fut.wait_for(milliseconds(0)), std::future_status::timeout);
  s_.a->set("late", bytes("here"));
  EXPECT_EQ(fut.get(), bytes("here"));
}

TEST_P(StoreSemanticsTest, BlockedGetDoesNotBlockOtherCallsOnSameObject) {
  // One handle, two threads: the setter must get through while get waits.
  auto fut = std::async(std::launch::async, [&] { return s_.b->get("same", milliseconds(3000)); });
  std::this_thread::sleep_for(milliseconds(30));
  s_.b->set("other", bytes("x"));
  EXPECT_EQ(s_.b->add("counter", 1), 1);
  s_.b->set("same", bytes("ok"));
  EXPECT_EQ(fut.get(), bytes("ok"));
}

TEST_P(StoreSemanticsTest, GetTimeoutNamesTheKey) {
  auto start = std::chrono::steady_clock::now();
  try {
    s_.b->get("never-set-key", milliseconds(100));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.detail(), HasSubstr("never-set-key'"));
    EXPECT_THAT(e.detail(), HasSubstr("100 ms"));
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(95));
  EXPECT_LT(took, milliseconds(1500));
  // The store (and, for TCP, the connection) still works afterwards.
  s_.a->set("after", bytes("1"));
  EXPECT_EQ(s_.b->get("after", milliseconds(1000)), bytes("1"));
}

// multiGet waits for every key, answers in the request's order (values of
// any size, empty ones too), and a timeout names the keys still missing.
TEST_P(StoreSemanticsTest, MultiGetWaitsForEveryKeyAndKeepsTheOrder) {
  EXPECT_TRUE(s_.b->multiGet({}, milliseconds(0)).empty());
  s_.a->set("m2", bytes("two"));
  s_.a->set("m0", {});
  auto fut = std::async(std::launch::async, [&] {
    return s_.b->multiGet({"m0", "m1", "m2", "m0"}, milliseconds(3000));
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(fut.wait_for(milliseconds(0)), std::future_status::timeout);
  const std::vector<uint8_t> big(100000, 7);
  s_.a->set("m1", big);
  const std::vector<std::vector<uint8_t>> v = fut.get();
  ASSERT_EQ(v.size(), 4u);
  EXPECT_TRUE(v[0].empty());
  EXPECT_EQ(v[1], big);
  EXPECT_EQ(v[2], bytes("two"));
  EXPECT_TRUE(v[3].empty());
  try {
    s_.b->multiGet({"m2", "never-1", "never-2"}, milliseconds(100));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.detail(), HasSubstr("never-1'"));
    EXPECT_THAT(e.detail(), HasSubstr("never-2'"));
  }
  // Still in step afterwards.
  EXPECT_EQ(s_.b->multiGet({"m2"}, milliseconds(1000))[0], bytes("two"));
}

// A multi-set wakes the waiters of every key it sets, replaces values, and
// goes in several requests where one would be too large (TCP: 1 MiB), a
// value too large for any goes by itself.
TEST_P(StoreSemanticsTest, MultiSetSetsEveryKeyAndWakesTheirWaiters) {
  s_.a->multiSet({}, {});
  s_.a->set("s1", bytes("old"));
  auto fut = std::async(std::launch::async, [&] {
    return s_.b->multiGet({"s0", "s1", "s2"}, milliseconds(3000));
  });
  std::this_thread::sleep_for(milliseconds(50));
  s_.a->multiSet({"s0", "s1", "s2"}, {bytes("zero"), bytes("one"), {}});
  const std::vector<std::vector<uint8_t>> v = fut.get();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], bytes("zero"));
  EXPECT_EQ(v[1], bytes("one"));
  EXPECT_TRUE(v[2].empty());
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < 3000; ++i) {
    keys.push_back("many/" + std::to_string(i));
    values.emplace_back(i == 7 ? size_t{2} << 20 : size_t{1000}, static_cast<uint8_t>(i));
  }
  s_.a->multiSet(keys, values);
  EXPECT_EQ(s_.b->multiGet(keys, milliseconds(1000)), values);
  EXPECT_EQ(s_.b->get("s1", milliseconds(1000)), bytes("one"));  // still in step
}

TEST_P(StoreSemanticsTest, ZeroTimeout) {
  s_.a->set("present", bytes("p"));
  EXPECT_EQ(s_.b->get("present", milliseconds(0)), bytes("p"));
  EXPECT_THROW(s_.b->get("absent", milliseconds(0)), Error);
}

TEST_P(StoreSemanticsTest, WaitForSeveralKeys) {
  s_.b->wait({}, milliseconds(0));  // nothing to wait for
  auto fut = std::async(std::launch::async, [&] {
    s_.b->wait({"w1", "w2", "w3"}, milliseconds(3000));
  });
  s_.a->set("w1", bytes("1"));
  s_.a->set("w3", bytes("3"));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(fut.wait_for(milliseconds(0)), std::future_status::timeout);
  s_.a->set("w2", bytes("2"));
  fut.get();
}

TEST_P(StoreSemanticsTest, WaitTimeoutNamesOnlyMissingKeys) {
  s_.a->set("have", bytes("1"));
  try {
    s_.b->wait({"have", "missing-one"}, milliseconds(100));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.detail(), HasSubstr("missing-one'"));
    EXPECT_THAT(e.detail(), HasSubstr("1 of 2"));
    EXPECT_THAT(e.detail(), testing::Not(HasSubstr("have'")));
  }
}

TEST_P(StoreSemanticsTest, AddSemantics) {
  EXPECT_EQ(s_.a->add("c", 5), 5);
  EXPECT_EQ(s_.b->add("c", -7), -2);
  EXPECT_EQ(s_.a->add("c", 0), -2);
  EXPECT_EQ(s_.b->getString("c", milliseconds(100)), "-2");  // counters are decimal strings
  s_.a->setString("n", "41");
  EXPECT_EQ(s_.b->add("n", 1), 42);
}

TEST_P(StoreSemanticsTest, AddWakesWaiters) {
  auto fut =
      std::async(std::launch::async, [&] { return s_.b->getString("ctr", milliseconds(3000)); });
  std::this_thread::sleep_for(milliseconds(20));
  s_.a->add("ctr", 3);
  EXPECT_EQ(fut.get(), "3");
}

TEST_P(StoreSemanticsTest, AddOnNonIntegerOrOverflowIsInvalidArgument) {
  s_.a->setString("text", "hello");
  try {
    s_.b->add("text", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("text"));
  }
  s_.a->add("big", INT64_MAX);
  try {
    s_.b->add("big", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("overflow"));
  }
  EXPECT_EQ(s_.a->add("big", -1), INT64_MAX - 1);  // the failed add changed nothing
}

TEST_P(StoreSemanticsTest, ConcurrentAddFromThreads) {
  constexpr int kThreads = 8, kAdds = 100;
  std::vector<std::shared_ptr<Store>> handles;
  for (int t = 0; t < kThreads; ++t) handles.push_back(t % 2 ? s_.a : s_.another());
  std::vector<std::thread> threads;
  std::atomic<int64_t> maxSeen{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        int64_t v = handles[t]->add("shared", 1);
        int64_t prev = maxSeen.load();
        while (v > prev && !maxSeen.compare_exchange_weak(prev, v)) {
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(s_.b->add("shared", 0), kThreads * kAdds);
  EXPECT_EQ(maxSeen.load(), kThreads * kAdds);
}

TEST_P(StoreSemanticsTest, LargeValue) {
  std::vector<uint8_t> big(16 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  s_.a->set("big", big);
  EXPECT_EQ(s_.b->get("big", milliseconds(5000)), big);
}

TEST_P(StoreSemanticsTest, RendezvousOfRanksAsThreads) {
  constexpr int kRanks = 16;
  std::vector<std::thread> ranks;
  std::vector<std::string> seen(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      auto store = s_.another();
      store->setString("addr/" + std::to_string(r), "rank" + std::to_string(r));
      std::vector<std::string> keys;
      for (int p = 0; p < kRanks; ++p) keys.push_back("addr/" + std::to_string(p));
      store->wait(keys, milliseconds(5000));
      for (int p = 0; p < kRanks; ++p) seen[r] += store->getString(keys[p], milliseconds(100));
      store->add("done", 1);
    });
  }
  for (auto& t : ranks) t.join();
  std::string expect;
  for (int p = 0; p < kRanks; ++p) expect += "rank" + std::to_string(p);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], expect);
  EXPECT_EQ(s_.a->add("done", 0), kRanks);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreSemanticsTest, testing::Values("hash", "prefix", "tcp"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(PrefixStoreTest, KeysAreNamespaced) {
  auto base = createHashStore();
  auto a = createPrefixStore("a", base);
  auto ab = createPrefixStore("ab", base);
  a->setString("x", "1");
  ab->setString("x", "2");
  EXPECT_EQ(base->getString("a/x", milliseconds(0)), "1");
  EXPECT_EQ(base->getString("ab/x", milliseconds(0)), "2");
  EXPECT_THROW(base->get("x", milliseconds(0)), Error);
  auto nested = createPrefixStore("n", a);
  nested->setString("y", "3");
  EXPECT_EQ(base->getString("a/n/y", milliseconds(0)), "3");
  try {
    a->get("missing", milliseconds(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.detail(), HasSubstr("a/missing"));  // the real key, for debugging
  }
  EXPECT_THROW(createPrefixStore("p", nullptr), Error);
}

}  // namespace
}  // namespace gflow
