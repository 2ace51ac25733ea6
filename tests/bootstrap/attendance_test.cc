// Attendance (bootstrap/attendance.h): members that arrive are counted in,
// a member that never comes is counted out by the deadline, one that comes
// after the deadline finds itself out, members named absent are claimed out
// at once, and every member gets the same answer however close to the
// deadline a member arrives and however the survivors' hints differ; and
// unanimous(), the members' yes-or-no question.
#include "bootstrap/attendance.h"

#include <gtest/gtest.h>

#include <thread>

#include "gflow/error.h"

namespace gflow::bootstrap {
namespace {

using std::chrono::milliseconds;

Meeting meeting(const std::shared_ptr<Store>& store, const std::string& prefix, int self,
                milliseconds timeout) {
  return Meeting{store, prefix, {0, 1, 2, 3}, self, {}, timeout};
}

TEST(Attendance, EveryMemberArrivesAndIsCountedIn) {
  auto store = createHashStore();
  std::vector<std::vector<int>> seen(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r) {
    ts.emplace_back([&, r] { seen[r] = attend(meeting(store, "m/", r, milliseconds(5000))); });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(seen[r], (std::vector<int>{0, 1, 2, 3})) << "rank " << r;
}

TEST(Attendance, AnAbsentMemberIsCountedOutAndALateOneIsTold) {
  auto store = createHashStore();
  std::vector<std::vector<int>> seen(4);
  std::vector<std::thread> ts;
  for (int r : {0, 1, 3}) {
    ts.emplace_back([&, r] { seen[r] = attend(meeting(store, "m/", r, milliseconds(300))); });
  }
  for (auto& t : ts) t.join();
  for (int r : {0, 1, 3}) EXPECT_EQ(seen[r], (std::vector<int>{0, 1, 3})) << "rank " << r;
  // The late member learns that it was counted out.
  EXPECT_EQ(attend(meeting(store, "m/", 2, milliseconds(300))), (std::vector<int>{}));
}

// Survivors whose verdicts differ (0 and 1 blame rank 2, rank 2 blames rank
// 3, which is gone): each claims its culprit out at once, and all end with
// one membership, rank 2 in or out by whichever claim came first.
TEST(Attendance, SurvivorsThatBlameDifferentRanksEndWithOneMembership) {
  for (int trial = 0; trial < 20; ++trial) {
    auto store = createHashStore();
    std::vector<std::vector<int>> seen(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        Meeting m = meeting(store, "m/", r, milliseconds(5000));
        m.absent = {r == 2 ? 3 : 2};
        seen[r] = attend(m);
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(seen[0], seen[1]) << "trial " << trial;
    const bool twoIn = seen[2] == seen[0];
    EXPECT_TRUE(twoIn ? seen[0] == std::vector<int>({0, 1, 2})
                      : seen[0] == std::vector<int>({0, 1}) && seen[2].empty())
        << "trial " << trial;
  }
}

// Member 3 arrives around the others' deadline, over many trials: whatever
// the race's outcome, all four agree on it (3 itself by finding itself out).
TEST(Attendance, AMemberArrivingAtTheDeadlineGetsOneAnswer) {
  auto store = createHashStore();
  int in = 0, out = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::string prefix = "t" + std::to_string(trial) + "/";
    std::vector<std::vector<int>> seen(4);
    bool lateRaised = false;
    std::vector<std::thread> ts;
    for (int r = 0; r < 4; ++r) {
      ts.emplace_back([&, r] {
        if (r == 3) {
          std::this_thread::sleep_for(milliseconds(15 + trial % 10));
          seen[r] = attend(meeting(store, prefix, r, milliseconds(20)));
          lateRaised = seen[r].empty();
          return;
        }
        seen[r] = attend(meeting(store, prefix, r, milliseconds(20)));
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(seen[0], seen[1]) << "trial " << trial;
    EXPECT_EQ(seen[0], seen[2]) << "trial " << trial;
    const bool counted = seen[0].size() == 4;
    EXPECT_EQ(counted, !lateRaised) << "trial " << trial;
    (counted ? in : out)++;
  }
  std::printf("attendance at the deadline: %d in, %d out\n", in, out);
}

// unanimous(): true only where every member said yes; a no returns at once,
// and a member that never answers is a timeout, not a silent no or yes.
TEST(Unanimous, EveryMemberMustSayYes) {
  auto store = createHashStore();
  for (int no = -1; no < 3; ++no) {  // -1: all say yes; else that member says no
    const std::string prefix = "u" + std::to_string(no) + "/";
    std::vector<int> answer(3, -1);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back(
          [&, r] { answer[r] = unanimous(*store, prefix, 3, r != no, milliseconds(5000)); });
    }
    for (auto& t : ts) t.join();
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(answer[r], no < 0 ? 1 : 0) << "no " << no << " rank " << r;
  }
  EXPECT_FALSE(unanimous(*store, "alone/", 2, false, milliseconds(50))) << "a no never waits";
  try {
    unanimous(*store, "lone/", 2, true, milliseconds(50));
    ADD_FAILURE() << "member 1 never answered";
  } catch (const gflow::Error& e) {
    EXPECT_EQ(e.code(), gflow::ErrorCode::kTimeout) << e.what();
  }
}

}  // namespace
}  // namespace gflow::bootstrap
