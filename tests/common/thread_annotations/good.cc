// Compiled by clang with -Wthread-safety -Werror (tests/CMakeLists.txt,
// thread_annotations_check): every guarded access below holds its
// capability, so it must compile.
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
