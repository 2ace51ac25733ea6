// fault_worker: one rank of a process-based fault test (tests/faults/).
//
// The identity comes from the environment (GFLOW_RANK, GFLOW_WORLD_SIZE,
// GFLOW_ROOT, GFLOW_JOB_TOKEN, GFLOW_TIMEOUT) through the public API only:
// gflow::Communicator::create(). The command line names what to do:
//
//   fault_worker [PREFIX...] MODE ARGS...
//   PREFIX:
//     sleep-before-init MS   sleep before Communicator::create
//     linger MS              after MODE succeeded, keep the communicator for MS,
//                            then fail if it has been failed meanwhile
//     op NAME                the collective of `loop`: allreduce (default),
//                            alltoall (BYTES per rank, every block verified),
//                            alltoallv (uneven blocks of up to BYTES / N,
//                            verified),
//                            reduce (to rank 0, verified there) or sendrecv
//                            (BYTES to the next rank, from the previous one,
//                            one sendRecv; verified)
//   MODE:
//     loop ITERS BYTES [PAUSE_MS]   ITERS allreduces (0: forever) of BYTES
//                                   (float32 sum, verified), PAUSE_MS between
//     mismatch op|count BYTES       one good allreduce; then rank 1 calls
//                                   broadcast(root 0) (op) or allreduces one
//                                   more element (count) while others allreduce
//     reducer ITERS CYCLE_MS        ITERS (0: forever) GradientReducer steps
//                                   over 24 gradients of 160 KiB (1 MiB
//                                   buckets; CYCLE_MS > 0: negotiated rounds),
//                                   ready() in reverse order on odd ranks;
//                                   float32 sum, verified
//     reproduce COUNT CUT           one allreduce (sum) of COUNT float32
//                                   values (reproducible_values.h), as
//                                   ops of at most CUT elements (0: one);
//                                   prints the result's digest
//     straggle ITERS BYTES SLOW     ITERS allreduces of BYTES (float32 sum,
//                                   verified), rank SLOW sleeping a random
//                                   5-50 ms (the same draws on every rank)
//                                   before each, then one without; prints
//                                   when each op was called and the
//                                   straggler counts of Stats over them
//
// Output (stdout, one line each, flushed):
//   GFLOW_READY rank=R size=N
//   GFLOW_PROGRESS rank=R iter=I          after each completed op (1-based)
//   GFLOW_DONE rank=R iters=N
//   GFLOW_DIGEST rank=R digest=D          (reproduce: the result's FNV-1a, decimal)
//   GFLOW_CALLED rank=R iter=I ns=T       (straggle: steady clock before the call)
//   GFLOW_STRAGGLERS rank=R ops=N last=C0,C1,... late=NS0,NS1,...
//                                         (straggle: Stats deltas over its ops)
//   GFLOW_SUMMARY rank=R <stragglerSummary()>
//   GFLOW_ERROR code=<toString(ErrorCode)> rank=R peer=P op=O seq=S what=<what()>
//
// Exit status: 0 success; 10 + ErrorCode for a gflow::Error (10 invalid_argument,
// 11 timeout, 12 peer_lost, 13 mismatch, 14 unauthorized, 15 aborted,
// 16 internal); 3 wrong allreduce result; 4 another exception; 2 bad usage.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "faults/reproducible_values.h"
#include "gflow/gflow.h"

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitWrongResult = 3;
constexpr int kExitOtherException = 4;
constexpr int kExitGflowBase = 10;

int envRank() {
  const char* r = std::getenv("GFLOW_RANK");
  return r ? std::atoi(r) : -1;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::string oneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "fault_worker: %s\n", why.c_str());
  std::exit(kExitUsage);
}

long argNum(const std::vector<std::string>& args, size_t i, const char* what) {
  if (i >= args.size()) usage(std::string("missing ") + what);
  char* end = nullptr;
  long v = std::strtol(args[i].c_str(), &end, 10);
  if (end == args[i].c_str() || *end != '\0' || v < 0) usage(std::string("bad ") + what);
  return v;
}

// Values whose float32 sum over any world size is exact.
float valueAt(int rank, size_t i, long iter) {
  return static_cast<float>((rank + 1) * static_cast<int>((i + static_cast<size_t>(iter)) % 7 + 1));
}

void fill(std::vector<float>& buf, int rank, long iter) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = valueAt(rank, i, iter);
}

// Returns the index of the first wrong element, or -1.
long verify(const std::vector<float>& buf, int size, long iter) {
  const float ranks = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = ranks * static_cast<float>((i + static_cast<size_t>(iter)) % 7 + 1);
    if (buf[i] != want) return static_cast<long>(i);
  }
  return -1;
}

// All-to-all: rank r's element i of block j is valueAt(r, i + j, iter), so
// block j of the result holds valueAt(j, i + r, iter).
long alltoallStep(gflow::Communicator& comm, std::vector<float>& buf, long it) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = buf.size() / static_cast<size_t>(n);
  std::vector<float> in(block * static_cast<size_t>(n));
  for (size_t k = 0; k < in.size(); ++k) in[k] = valueAt(r, k % block + k / block, it);
  comm.alltoall(gflow::tensor(in.data(), in.size()), gflow::tensor(buf.data(), in.size()));
  for (size_t k = 0; k < in.size(); ++k) {
    if (buf[k] != valueAt(static_cast<int>(k / block), k % block + static_cast<size_t>(r), it)) {
      return static_cast<long>(k);
    }
  }
  return -1;
}

// Uneven all-to-all: rank r sends c(r, j) = block * (1 + (r + j) % 3) / 3
// elements to rank j (block: BYTES per rank / N), element k of them
// valueAt(r, k + j, iter).
long alltoallvStep(gflow::Communicator& comm, std::vector<float>& buf, long it) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = buf.size() / static_cast<size_t>(n);
  auto count = [block](int from, int to) { return block * (1 + (from + to) % 3) / 3; };
  std::vector<size_t> inCounts, inOffsets, outCounts, outOffsets;
  size_t inTotal = 0, outTotal = 0;
  for (int j = 0; j < n; ++j) {
    inCounts.push_back(count(r, j));
    inOffsets.push_back(inTotal);
    inTotal += inCounts.back();
    outCounts.push_back(count(j, r));
    outOffsets.push_back(outTotal);
    outTotal += outCounts.back();
  }
  std::vector<float> in(inTotal), out(outTotal);
  for (int j = 0; j < n; ++j) {
    for (size_t k = 0; k < inCounts[j]; ++k) in[inOffsets[j] + k] = valueAt(r, k + j, it);
  }
  comm.alltoallv(gflow::tensor(in.data(), in.size()), inCounts, inOffsets,
                 gflow::tensor(out.data(), out.size()), outCounts, outOffsets);
  for (int i = 0; i < n; ++i) {
    for (size_t k = 0; k < outCounts[i]; ++k) {
      if (out[outOffsets[i] + k] != valueAt(i, k + r, it))
        return static_cast<long>(outOffsets[i] + k);
    }
  }
  return -1;
}

// Point-to-point ring: BYTES to the next rank, from the previous one, in
// one sendRecv; element i from rank p is valueAt(p, i, iter).
long sendRecvStep(gflow::Communicator& comm, std::vector<float>& buf, long it) {
  const int n = comm.size(), r = comm.rank();
  std::vector<float> out(buf.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = valueAt(r, i, it);
  comm.sendRecv({gflow::P2POp::send(gflow::tensor(out.data(), out.size()), (r + 1) % n),
                 gflow::P2POp::recv(gflow::tensor(buf.data(), buf.size()), (r + n - 1) % n)});
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != valueAt((r + n - 1) % n, i, it)) return static_cast<long>(i);
  }
  return -1;
}

// One verified op of `loop`; returns the first wrong index or -1.
long loopStep(gflow::Communicator& comm, const std::string& op, std::vector<float>& buf, long it) {
  if (op == "alltoall") return alltoallStep(comm, buf, it);
  if (op == "alltoallv") return alltoallvStep(comm, buf, it);
  if (op == "sendrecv") return sendRecvStep(comm, buf, it);
  fill(buf, comm.rank(), it);
  if (op == "reduce") {
    comm.reduce(gflow::tensor(buf.data(), buf.size()), 0);
    return comm.rank() == 0 ? verify(buf, comm.size(), it) : -1;
  }
  comm.allreduce(gflow::tensor(buf.data(), buf.size()));
  return verify(buf, comm.size(), it);
}

int runLoop(gflow::Communicator& comm, const std::vector<std::string>& args,
            const std::string& op) {
  const long iters = argNum(args, 1, "ITERS");
  const long bytes = argNum(args, 2, "BYTES");
  const long pauseMs = args.size() > 3 ? argNum(args, 3, "PAUSE_MS") : 0;
  std::vector<float> buf(static_cast<size_t>(bytes) / sizeof(float));
  for (long it = 0; iters == 0 || it < iters; ++it) {
    long bad = loopStep(comm, op, buf, it);
    if (bad >= 0) {
      say("GFLOW_WRONG rank=" + std::to_string(comm.rank()) + " iter=" + std::to_string(it + 1) +
          " index=" + std::to_string(bad) + " got=" + std::to_string(buf[bad]));
      return kExitWrongResult;
    }
    say("GFLOW_PROGRESS rank=" + std::to_string(comm.rank()) + " iter=" + std::to_string(it + 1));
    if (pauseMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pauseMs));
  }
  say("GFLOW_DONE rank=" + std::to_string(comm.rank()) + " iters=" + std::to_string(iters));
  return 0;
}

int runReproduce(gflow::Communicator& comm, const std::vector<std::string>& args) {
  const auto count = static_cast<size_t>(argNum(args, 1, "COUNT"));
  const auto cut = static_cast<size_t>(argNum(args, 2, "CUT"));
  std::vector<float> v = gflow::faulttest::reproducibleInput(comm.rank(), count);
  const size_t step = cut == 0 ? std::max<size_t>(count, 1) : cut;
  for (size_t at = 0; at < count; at += step) {
    comm.allreduce(gflow::tensor(v.data() + at, std::min(step, count - at)));
  }
  say("GFLOW_DIGEST rank=" + std::to_string(comm.rank()) +
      " digest=" + std::to_string(gflow::faulttest::digestOf(v)));
  say("GFLOW_DONE rank=" + std::to_string(comm.rank()) + " iters=1");
  return 0;
}

int runMismatch(gflow::Communicator& comm, const std::vector<std::string>& args) {
  if (args.size() < 2 || (args[1] != "op" && args[1] != "count")) usage("mismatch op|count BYTES");
  const long bytes = argNum(args, 2, "BYTES");
  std::vector<float> buf(static_cast<size_t>(bytes) / sizeof(float) + 1);
  const size_t n = buf.size() - 1;
  fill(buf, comm.rank(), 0);
  comm.allreduce(gflow::tensor(buf.data(), n));
  say("GFLOW_PROGRESS rank=" + std::to_string(comm.rank()) + " iter=1");
  fill(buf, comm.rank(), 1);
  if (comm.rank() == 1 && args[1] == "op") {
    comm.broadcast(gflow::tensor(buf.data(), n), 0);
  } else if (comm.rank() == 1) {
    comm.allreduce(gflow::tensor(buf.data(), n + 1));
  } else {
    comm.allreduce(gflow::tensor(buf.data(), n));
  }
  say("GFLOW_PROGRESS rank=" + std::to_string(comm.rank()) + " iter=2");
  say("GFLOW_DONE rank=" + std::to_string(comm.rank()) + " iters=2");
  return 0;
}

int runReducer(const std::shared_ptr<gflow::Communicator>& comm,
               const std::vector<std::string>& args) {
  const long iters = argNum(args, 1, "ITERS");
  const long cycleMs = argNum(args, 2, "CYCLE_MS");
  std::vector<std::vector<float>> grads(24, std::vector<float>(40960));
  std::vector<gflow::Tensor> tensors;
  for (auto& g : grads) tensors.push_back(gflow::tensor(g.data(), g.size()));
  gflow::ReducerOptions options;
  options.op = gflow::ReduceOp::kSum;
  options.fusionThreshold = 1 << 20;
  options.cycleTime = std::chrono::milliseconds(cycleMs);
  gflow::GradientReducer reducer(comm, tensors, options);
  const int rank = comm->rank();
  for (long it = 0; iters == 0 || it < iters; ++it) {
    for (size_t k = 0; k < grads.size(); ++k) {
      const size_t i = rank % 2 ? grads.size() - 1 - k : k;
      fill(grads[i], rank, it + static_cast<long>(i));
      reducer.ready(i);
    }
    reducer.wait();
    for (size_t i = 0; i < grads.size(); ++i) {
      long bad = verify(grads[i], comm->size(), it + static_cast<long>(i));
      if (bad >= 0) {
        say("GFLOW_WRONG rank=" + std::to_string(rank) + " iter=" + std::to_string(it + 1) +
            " tensor=" + std::to_string(i) + " index=" + std::to_string(bad) +
            " got=" + std::to_string(grads[i][static_cast<size_t>(bad)]));
        return kExitWrongResult;
      }
    }
    say("GFLOW_PROGRESS rank=" + std::to_string(rank) + " iter=" + std::to_string(it + 1));
  }
  say("GFLOW_DONE rank=" + std::to_string(rank) + " iters=" + std::to_string(iters));
  return 0;
}

int runStraggle(gflow::Communicator& comm, const std::vector<std::string>& args) {
  const long iters = argNum(args, 1, "ITERS");
  const long bytes = argNum(args, 2, "BYTES");
  const long slow = argNum(args, 3, "SLOW");
  const int rank = comm.rank();
  std::vector<float> buf(static_cast<size_t>(bytes) / sizeof(float));
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> sleepMs(5, 50);
  const gflow::Stats before = comm.stats();
  for (long it = 0; it <= iters; ++it) {
    const int ms = sleepMs(rng);
    if (rank == slow && it < iters) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    say("GFLOW_CALLED rank=" + std::to_string(rank) + " iter=" + std::to_string(it) +
        " ns=" + std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    fill(buf, rank, it);
    comm.allreduce(gflow::tensor(buf.data(), buf.size()));
    if (verify(buf, comm.size(), it) >= 0) return kExitWrongResult;
  }
  const gflow::Stats after = comm.stats();
  std::string last, late;
  for (size_t p = 0; p < after.peers.size(); ++p) {
    last += (p ? "," : "") + std::to_string(after.peers[p].timesLast - before.peers[p].timesLast);
    late += (p ? "," : "") + std::to_string(after.peers[p].lateNs - before.peers[p].lateNs);
  }
  say("GFLOW_STRAGGLERS rank=" + std::to_string(rank) + " ops=" +
      std::to_string(after.arrivalOps - before.arrivalOps) + " last=" + last + " late=" + late);
  say("GFLOW_SUMMARY rank=" + std::to_string(rank) + " " + comm.stragglerSummary());
  return 0;
}

int reportError(const gflow::Error& e, int rank) {
  say(std::string("GFLOW_ERROR code=") + gflow::toString(e.code()) +
      " rank=" + std::to_string(rank) + " peer=" + std::to_string(e.peer()) +
      " op=" + (e.op().empty() ? "-" : e.op()) + " seq=" + std::to_string(e.seq()) +
      " what=" + oneLine(e.what()));
  return kExitGflowBase + static_cast<int>(e.code());
}

int run(std::vector<std::string> args) {
  long sleepMs = 0, lingerMs = 0;
  std::string op = "allreduce";
  for (;;) {
    if (args.size() > 1 && args[0] == "op") {
      op = args[1];
      if (op != "allreduce" && op != "alltoall" && op != "alltoallv" && op != "reduce" &&
          op != "sendrecv") {
        usage("unknown op '" + op + "'");
      }
    } else if (!args.empty() && args[0] == "sleep-before-init") {
      sleepMs = argNum(args, 1, "sleep-before-init MS");
    } else if (!args.empty() && args[0] == "linger") {
      lingerMs = argNum(args, 1, "linger MS");
    } else {
      break;
    }
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty()) usage("no mode (loop | mismatch | reducer | reproduce | straggle)");
  if (args[0] != "loop" && args[0] != "mismatch" && args[0] != "reducer" &&
      args[0] != "reproduce" && args[0] != "straggle") {
    usage("unknown mode '" + args[0] + "'");
  }

  const int rank = envRank();
  try {
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
    std::shared_ptr<gflow::Communicator> comm = gflow::Communicator::create();
    say("GFLOW_READY rank=" + std::to_string(comm->rank()) +
        " size=" + std::to_string(comm->size()));
    int rc = args[0] == "loop"        ? runLoop(*comm, args, op)
             : args[0] == "reducer"   ? runReducer(comm, args)
             : args[0] == "reproduce" ? runReproduce(*comm, args)
             : args[0] == "straggle"  ? runStraggle(*comm, args)
                                      : runMismatch(*comm, args);
    if (rc != 0) return rc;
    if (lingerMs > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(lingerMs));
      if (auto e = comm->error()) return reportError(*e, rank);
      say("GFLOW_LINGERED rank=" + std::to_string(rank));
    }
    return 0;
  } catch (const gflow::Error& e) {
    return reportError(e, rank);
  } catch (const std::exception& e) {
    say("GFLOW_EXCEPTION rank=" + std::to_string(rank) + " what=" + oneLine(e.what()));
    return kExitOtherException;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run(std::vector<std::string>(argv + 1, argv + argc));
}
