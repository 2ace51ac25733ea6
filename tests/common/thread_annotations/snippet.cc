// Compiled by clang with -Wthread-safety -Werror (check.sh, ctest
// thread_annotations_check). As it is, every guarded access holds its
// capability and it compiles; BAD_LOCK touches a field without its mutex,
// BAD_ROLE one of a thread role from a function that never entered it, and
// each must fail to compile.
#include "common/thread_annotations.h"

namespace {

class Counter {
 public:
  void add() GFLOW_EXCLUDES(mu_) {
    gflow::MutexLock lock(mu_);
    ++n_;
  }
  void onOwner() {
    owner_.enter();
    ++ownedTicks_;
  }
#ifdef BAD_LOCK
  void addUnlocked() {
    ++n_;
  }
#endif
#ifdef BAD_ROLE
  void fromAnyThread() {
    ++ownedTicks_;
  }
#endif

 private:
  gflow::Mutex mu_;
  int n_ GFLOW_GUARDED_BY(mu_) = 0;
  gflow::ThreadRole owner_;
  int ownedTicks_ GFLOW_GUARDED_BY(owner_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.add();
  c.onOwner();
  return 0;
}
