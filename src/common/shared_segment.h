// Shared-memory segments of one host's ranks (the shm backend's group, the
// TCP wire's local rings).
//
// A rank creates anonymous segments (memfd_create) and maps those of its
// local peers by opening /proc/<pid>/fd/<fd> of the creator.
// Nothing is ever named in /dev/shm, so a rank killed with SIGKILL leaks
// nothing: the kernel frees a segment when the last mapping goes away.
//
// A peer is watched with a pidfd, which becomes readable when the process
// exits (even before it is reaped), so a dead local peer is noticed without
// relying on a socket.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gflow {

// A mapping of a segment; unmaps on destruction.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

  // Creates a segment of `size` bytes (zero-filled) and maps it. The memfd
  // stays open (fd()) until closeFd(), so peers can open it. Throws
  // Error(kInternal) naming the failing call.
  static Mapping create(size_t size);
  // Maps peer `pid`'s segment through /proc/<pid>/fd/<fd> (`readOnly`: for
  // reading only, so nothing here can write the peer's memory). Returns an
  // empty mapping and sets *why on failure (permissions, pid namespaces, a
  // segment smaller than `size`).
  static Mapping open(pid_t pid, int fd, size_t size, std::string* why, bool readOnly = false);

  int fd() const { return fd_; }
  void closeFd();

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  bool created_ = false;  // made here (create): counted in resources::sharedMapped
  int fd_ = -1;
};

// Watches a process for exit. Uses a pidfd where the kernel has one, else
// kill(pid, 0).
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(pid_t pid);
  ~ProcessWatch();
  ProcessWatch(ProcessWatch&& o) noexcept;
  ProcessWatch& operator=(ProcessWatch&& o) noexcept;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // True once the process has exited (never blocks).
  bool exited() const;

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

// Wakes and waits on a 32-bit word shared between processes (futex).
void futexWake(uint32_t* word);
// Returns when *word != expected, on a wake, or after `timeoutUs`.
void futexWait(uint32_t* word, uint32_t expected, int64_t timeoutUs);

}  // namespace gflow
