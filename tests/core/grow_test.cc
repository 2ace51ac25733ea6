// Communicator::grow and join with ranks as threads: joiners waiting on the
// job's store are admitted after the members, in arrival order, and the
// grown communicator reduces exactly; nobody waiting gives nullptr
// everywhere; a lost rank replaced (shrink, then grow); a joiner without the
// job's token is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "gflow/gflow.h"
#include "testing/paths.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using World = std::vector<std::shared_ptr<Communicator>>;

using testing::keepUntilThreadsEnd;
using testing::runThreads;

// Each rank adds (tag + 1) at every element; the result must be the sum of
// the tags + the count, exactly.
void expectSumOfTags(Communicator& c, int tag, int tagSum) {
  std::vector<float> v(50000, float(tag + 1));
  c.allreduce(tensor(v.data(), v.size()));
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], float(tagSum + c.size())) << i;
}

// Waits until `n` joiners took a number on `store`.
void awaitJoiners(Store& store, int n) {
  while (store.add("gflow/join/arrived", 0) < n) std::this_thread::sleep_for(milliseconds(2));
}

class Grow : public testing::OnPaths {
 protected:
  // The path's options over `store`, which the joiners share.
  Options options(const std::shared_ptr<Store>& store) const {
    Options o;
    o.store = store;
    o.timeout = milliseconds(10000);
    if (std::get<0>(GetParam()) == testing::WorldPath::kNetwork) o.shm.enabled = false;
    if (std::get<0>(GetParam()) == testing::WorldPath::kVerbs) o.transport = "verbs";
    return o;
  }
};

TEST_P(Grow, JoinersAreAdmittedAfterTheMembersInArrivalOrder) {
  auto store = createHashStore();
  const Options o = options(store);
  const int members = n(), joiners = 2;
  World w = testing::makeWorld(members, o);
  std::atomic<int> grewEmpty{0};  // members past their first grow()
  runThreads(members + joiners, [&](int t) {
    if (t >= members) {
      // Only after the members' first grow(), and the second joiner only
      // after the first took its number.
      while (grewEmpty.load() < members) std::this_thread::sleep_for(milliseconds(1));
      if (t == members + 1) awaitJoiners(*store, 1);
      std::shared_ptr<Communicator> c = Communicator::join(o);
      keepUntilThreadsEnd(c);
      EXPECT_EQ(c->size(), members + joiners);
      EXPECT_EQ(c->rank(), t);
      expectSumOfTags(*c, t, (members + joiners) * (members + joiners - 1) / 2);
      EXPECT_FALSE(c->grow());  // collective over the grown communicator
      return;
    }
    EXPECT_FALSE(w[t]->grow()) << "nobody waits yet";
    ++grewEmpty;
    awaitJoiners(*store, joiners);
    std::shared_ptr<Communicator> c = w[t]->grow();
    ASSERT_TRUE(c);
    keepUntilThreadsEnd(c);
    EXPECT_EQ(c->rank(), t);
    expectSumOfTags(*c, t, (members + joiners) * (members + joiners - 1) / 2);
    // The old communicator is still usable, and nobody waits any more.
    expectSumOfTags(*w[t], t, members * (members - 1) / 2);
    EXPECT_FALSE(c->grow());
  });
}

TEST_P(Grow, AReplacementJoinsTheSurvivorsOfALostRank) {
  auto store = createHashStore();
  const Options o = options(store);
  const int lost = 1;
  World w = testing::makeWorld(n(), o);
  std::atomic<int> done{0};  // members past the first allreduce
  runThreads(n() + 1, [&](int t) {
    if (t == n()) {  // the replacement
      std::shared_ptr<Communicator> c = Communicator::join(o);
      keepUntilThreadsEnd(c);
      EXPECT_EQ(c->rank(), n() - 1);
      expectSumOfTags(*c, 0, 0);
      return;
    }
    std::vector<float> v(64, 1.0f);
    w[t]->allreduce(tensor(v.data(), v.size()));
    ++done;
    if (t == lost) {
      while (done.load() < n()) std::this_thread::yield();  // lost between ops
      w[t].reset();
      return;
    }
    try {
      for (int i = 0; i < 100; ++i) w[t]->allreduce(tensor(v.data(), v.size()));
      ADD_FAILURE() << "no failure after rank " << lost << " was lost";
    } catch (const Error& e) {
      EXPECT_EQ(e.peer(), lost);
    }
    std::shared_ptr<Communicator> s = w[t]->shrink();
    ASSERT_TRUE(s);
    keepUntilThreadsEnd(s);
    awaitJoiners(*store, 1);
    std::shared_ptr<Communicator> g = s->grow();
    ASSERT_TRUE(g);
    keepUntilThreadsEnd(g);
    EXPECT_EQ(g->size(), n());
    expectSumOfTags(*g, 0, 0);
  });
}

INSTANTIATE_TEST_SUITE_P(, Grow,
                         ::testing::Values(testing::PathParam{testing::WorldPath::kShm, 3},
                                           testing::PathParam{testing::WorldPath::kNetwork, 3},
                                           testing::PathParam{testing::WorldPath::kVerbs, 2}),
                         testing::pathName);

TEST(Join, WithoutTheJobTokenIsRefused) {
  TcpStoreOptions so;
  so.isServer = true;
  so.token = "the-job-token";
  so.timeout = milliseconds(5000);
  TcpStore server(so);
  Options stranger;
  stranger.root = "127.0.0.1:" + std::to_string(server.port());
  stranger.token = "a-guess";
  stranger.timeout = milliseconds(3000);
  try {
    Communicator::join(stranger);
    ADD_FAILURE() << "a stranger joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthorized) << e.what();
  }
  // Nothing of it reached the store: no joiner number was taken.
  EXPECT_EQ(server.add("gflow/join/arrived", 0), 0);
}

// A joiner that gave up waiting withdrew its ticket: the next grow() admits
// nobody instead of waiting for it.
TEST(Join, AJoinerThatGaveUpIsNotAdmitted) {
  Options o;
  o.store = createHashStore();
  o.timeout = milliseconds(200);
  EXPECT_THROW(Communicator::join(o), Error);
  o.timeout = milliseconds(10000);
  World w = testing::makeWorld(2, o);
  runThreads(2, [&](int r) { EXPECT_FALSE(w[r]->grow()); });
}

// What the store holds is checked: a malformed admission is an error naming
// the joiner, and joiners that never come fail the grow() (kTimeout), not
// the members' communicator.
TEST(Join, ForgedStoreValuesFailCleanly) {
  auto store = createHashStore();
  store->add("gflow/join/1/ticket/claim", 1);
  store->setString("gflow/join/1/ticket", "admitted");
  store->setString("gflow/join/1/admission", "gflow/x\n99999999999999999999\n5");
  Options o;
  o.store = store;
  o.timeout = milliseconds(1000);
  try {
    Communicator::join(o);
    ADD_FAILURE() << "a malformed admission was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("joiner 1 in the store is malformed"), std::string::npos)
        << e.what();
  }
  store->add("gflow/join/arrived", 3);  // three phantom joiners
  World w = testing::makeWorld(2, o);
  runThreads(2, [&](int r) {
    try {
      w[r]->grow();
      ADD_FAILURE() << "grow() with phantom joiners returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      EXPECT_EQ(e.op(), "grow") << e.what();
    }
    expectSumOfTags(*w[r], r, 1);  // still usable
  });
}

TEST(Join, NobodyAdmittingIsATimeout) {
  Options o;
  o.store = createHashStore();
  o.timeout = milliseconds(300);
  try {
    Communicator::join(o);
    ADD_FAILURE() << "join returned with nobody growing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  }
}

}  // namespace
}  // namespace gflow
