// Attendance (bootstrap/attendance.h): members that arrive are counted in,
// a member that never comes is counted out by the deadline, one that comes
// after the deadline is told so, and every member gets the same answer
// however close to the deadline a member arrives.
#include "bootstrap/attendance.h"

#include <gtest/gtest.h>

#include <thread>

#include "gflow/error.h"

namespace gflow::bootstrap {
namespace {

using std::chrono::milliseconds;

Meeting meeting(const std::shared_ptr<Store>& store, const std::string& prefix, int self,
                milliseconds timeout) {
  return Meeting{store, prefix, {0, 1, 2, 3}, self, timeout};
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
  try {
    attend(meeting(store, "m/", 2, milliseconds(300)));
    ADD_FAILURE() << "a member counted out was let in";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_EQ(e.peer(), 2);
    EXPECT_NE(std::string(e.what()).find("counted as lost"), std::string::npos) << e.what();
  }
}

// Member 3 arrives around the others' deadline, over many trials: whatever
// the race's outcome, all four agree on it (3 itself by raising).
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
          try {
            seen[r] = attend(meeting(store, prefix, r, milliseconds(20)));
          } catch (const Error&) {
            lateRaised = true;
          }
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

}  // namespace
}  // namespace gflow::bootstrap
