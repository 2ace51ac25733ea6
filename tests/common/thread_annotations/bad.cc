// Compiled by clang with -Wthread-safety -Werror (tests/CMakeLists.txt,
// thread_annotations_check): BAD_LOCK touches a field without its mutex,
// BAD_ROLE one of a thread role from a function that never entered it;
// each must fail to compile.
#include "common/thread_annotations.h"

namespace {

class Counter {
 public:
#ifdef BAD_LOCK
  void add() { ++n_; }
#endif
#ifdef BAD_ROLE
  void fromAnyThread() { ++ownedTicks_; }
#endif

 private:
  gflow::Mutex mu_;
  int n_ GFLOW_GUARDED_BY(mu_) = 0;
  gflow::ThreadRole owner_;
  int ownedTicks_ GFLOW_GUARDED_BY(owner_) = 0;
};

}  // namespace

int main() {
  return 0;
}
