// Process-based fault tests, part 2: strangers sending garbage to the store
// and data ports of a running job (see job.h for how ranks are run).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store_protocol.h"
#include "common/auth.h"
#include "common/socket.h"
#include "gflow/gflow.h"
#include "transport/tcp/frame.h"

#include "faults/job.h"

namespace {

using namespace gflow::faulttest;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- raw sockets for the garbage tests ------------------------------------

gflow::net::Socket connectRaw(const std::string& host, uint16_t port) {
  return gflow::net::connectTo(host, port, gflow::Deadline::after(seconds(5)), "test target");
}

void sendBytes(int fd, const std::vector<uint8_t>& b) {
  // The peer may drop us at any point; that is its right.
  ssize_t r = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
  (void)r;
}

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  return b;
}

// Authenticates like a gflow process with the job's token; false when the
// other side refused (the caller then has nothing to send).
bool authenticateAs(int fd, const std::string& label) {
  try {
    gflow::auth::authenticate(fd, kToken, label, /*initiator=*/true,
                              gflow::Deadline::after(seconds(5)));
    return true;
  } catch (const gflow::Error& e) {
    ADD_FAILURE() << "authenticating to the " << label << " port: " << e.what();
    return false;
  }
}

gflow::TcpStoreOptions clientOptions(const Job& job) {
  gflow::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = job.port();
  o.token = kToken;
  o.timeout = seconds(5);
  return o;
}

// Garbage of every kind against the store at `port`. Connections that are
// meant to stay open (silent peers, half-sent frames) go to `keep`.
void attackStore(uint16_t port, std::vector<gflow::net::Socket>* keep, uint32_t seed) {
  namespace proto = gflow::bootstrap::proto;
  {  // random bytes, then close
    auto s = connectRaw("127.0.0.1", port);
    sendBytes(s.fd(), randomBytes(4096, seed));
  }
  {  // a huge length prefix before any handshake
    auto s = connectRaw("127.0.0.1", port);
    sendBytes(s.fd(), std::vector<uint8_t>(64, 0xff));
  }
  keep->push_back(connectRaw("127.0.0.1", port));  // connects, stays silent
  {
    auto s = connectRaw("127.0.0.1", port);  // a few handshake bytes, then silent
    sendBytes(s.fd(), {'G', 'F', 'L'});
    keep->push_back(std::move(s));
  }
  {  // authenticated, then a request announcing 4 GiB
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) {
      std::vector<uint8_t> h;
      proto::writeHeader(&h, proto::kRequestMagic, static_cast<uint8_t>(proto::Op::kSet),
                         0xffffffffu);
      sendBytes(s.fd(), h);
    }
  }
  {  // authenticated, then a request with a bad magic and random body
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) sendBytes(s.fd(), randomBytes(512, seed + 1));
  }
  {  // authenticated, half of a valid 1 MiB set, then silent
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) {
      std::vector<uint8_t> h;
      proto::writeHeader(&h, proto::kRequestMagic, static_cast<uint8_t>(proto::Op::kSet), 1u << 20);
      sendBytes(s.fd(), h);
      sendBytes(s.fd(), randomBytes(1000, seed + 2));
      keep->push_back(std::move(s));
    }
  }
}

// ---- 4. garbage to the store and data ports ---------------------------------

TEST(FaultGarbage, StoreSurvivesGarbageDuringSetupAndWhileJobRuns) {
  // Rank 2 starts late so the first batch hits the store mid-setup.
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "40", "262144", "25"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "1000"});
    return a;
  });
  job.start();
  std::vector<gflow::net::Socket> keep;
  attackStore(job.port(), &keep, 1);  // connectRaw retries until rank 0 listens
  ASSERT_TRUE(job.waitProgress(2, seconds(8))) << job.report();
  attackStore(job.port(), &keep, 2);
  {
    gflow::TcpStore client(clientOptions(job));
    EXPECT_EQ(client.getString("gflow/created/0", seconds(2)), "1");
  }
  ASSERT_TRUE(job.waitExit(seconds(10))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
  }
}

// The data listener of rank `target` as published in the store.
std::pair<std::string, uint16_t> dataAddress(const Job& job, int target) {
  gflow::TcpStore client(clientOptions(job));
  std::string addr = client.getString("gflow/w1/tcp/addr/" + std::to_string(target), seconds(5));
  return gflow::net::parseHostPort(addr, "data address");
}

// Strangers that talk garbage and go away: the setup must not notice.
void attackDataPort(const std::pair<std::string, uint16_t>& at, uint32_t seed) {
  namespace tcp = gflow::transport::tcp;
  {
    auto s = connectRaw(at.first, at.second);
    sendBytes(s.fd(), randomBytes(4096, seed));
  }
  {
    auto s = connectRaw(at.first, at.second);
    sendBytes(s.fd(), std::vector<uint8_t>(64, 0xff));
  }
  {  // knows the token, but a bad hello
    auto s = connectRaw(at.first, at.second);
    if (authenticateAs(s.fd(), "gflow-data/v1")) {
      sendBytes(s.fd(), randomBytes(sizeof(tcp::Hello), seed + 1));
    }
  }
  {  // knows the token and the communicator, claims a rank outside the world
    auto s = connectRaw(at.first, at.second);
    if (authenticateAs(s.fd(), "gflow-data/v1")) {
      const std::string prefix = "gflow/w1/";  // as tcp_connect.cc derives the id
      gflow::auth::Digest d = gflow::auth::sha256(prefix.data(), prefix.size());
      uint64_t commId;
      std::memcpy(&commId, d.data(), sizeof(commId));
      tcp::Hello h{tcp::kHelloMagic, tcp::kProtocolVersion, 7, 8, 0, 1, 0, commId, {}};
      std::vector<uint8_t> b(sizeof(h));
      std::memcpy(b.data(), &h, sizeof(h));
      sendBytes(s.fd(), b);
      uint8_t ok = 1;
      EXPECT_EQ(::recv(s.fd(), &ok, 1, MSG_WAITALL), 1);
      EXPECT_EQ(ok, 0) << "a hello from rank 7 of 8 was accepted";
    }
  }
}

TEST(FaultGarbage, DataListenersSurviveGarbageDuringSetup) {
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "5", "65536"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "2000"});
    return a;
  });
  job.start();
  attackDataPort(dataAddress(job, 0), 10);
  attackDataPort(dataAddress(job, 1), 20);
  EXPECT_LT(secondsSince(job.started(), Clock::now()), 2.0)
      << "precondition: the garbage was meant to arrive before rank 2 connects";
  ASSERT_TRUE(job.waitExit(seconds(10))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
  }
}

// With connections on demand the data listeners stay open while the job
// runs: strangers' garbage there, between the ops, must change nothing.
TEST(FaultGarbage, OnDemandDataListenersSurviveGarbageWhileTheJobRuns) {
  Job job(4, [](int) { return std::vector<std::string>{"loop", "40", "262144", "25"}; });
  job.setEnv("GFLOW_CONNECT", "lazy");
  job.setEnv("GFLOW_SHM", "0");
  job.start();
  ASSERT_TRUE(job.waitProgress(2, seconds(8))) << job.report();
  for (int target = 0; target < 4; ++target) attackDataPort(dataAddress(job, target), 30 + target);
  ASSERT_TRUE(job.waitExit(seconds(20))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
  }
}

// Strangers that connect to the data ports of ranks 0..1 and say nothing (a
// port scanner, a health check; `perPort` of them on each of `ports` ranks)
// while rank 2 is still to connect: every rank must finish its loop.
void expectSetupCompletesWithIdleStrangers(int ports, int perPort, const char* label) {
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "3", "65536"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "1500"});
    return a;
  });
  job.setEnv("GFLOW_TIMEOUT", "6s");
  job.start();
  std::vector<gflow::net::Socket> idle;
  for (int target = 0; target < ports; ++target) {
    auto at = dataAddress(job, target);
    for (int i = 0; i < perPort; ++i) idle.push_back(connectRaw(at.first, at.second));
  }
  ASSERT_LT(secondsSince(job.started(), Clock::now()), 1.5)
      << "precondition: the strangers were meant to connect before rank 2";
  const bool finished = job.waitExit(seconds(8));
  const std::string report = job.report();
  ASSERT_TRUE(finished) << report;
  for (int r = 0; r < 3; ++r) {
    const RankResult& res = job.result(r);
    logRank(label, r, secondsSince(job.started(), res.exitTime), res);
    EXPECT_EQ(res.exitCode, 0) << "rank " << r << "\n" << report;
  }
}

TEST(FaultGarbage, SilentStrangerOnDataPortDoesNotStallSetup) {
  expectSetupCompletesWithIdleStrangers(1, 1, "silent stranger");
}

// More idle strangers than the pending-handshake bound (64) on the data
// ports of two ranks: the oldest are dropped to make room, so setup
// completes (before, every rank failed: "ranks 2 did not connect within the
// deadline").
TEST(FaultGarbage, ManyIdleStrangersOnDataPortsDoNotStallSetup) {
  expectSetupCompletesWithIdleStrangers(2, 70, "idle strangers");
}

// The local address rank 0's store listens on ("ADDR:PORT" in
// /proc/net/tcp's hex, e.g. "0100007F:1F90"), or "" while nothing listens.
std::string listeningAddress(uint16_t port) {
  std::ifstream in("/proc/net/tcp");
  char portHex[8];
  std::snprintf(portHex, sizeof(portHex), "%04X", port);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string slot, local, remote, state;
    ls >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == portHex) {
      return local;
    }
  }
  return "";
}

// A job without a token: rank 0 warns once that strangers may join, and its
// store listens only on the root address (127.0.0.1 here), not on every
// interface; with GFLOW_REQUIRE_TOKEN=1 every rank refuses to start.
TEST(FaultGarbage, AJobWithoutATokenWarnsAndListensOnlyOnTheRootAddress) {
  {
    // 20 ops 50 ms apart: the store listens for a second or more, which the
    // polls below must see even on a loaded machine.
    Job job(2, [](int) { return std::vector<std::string>{"loop", "20", "65536", "50"}; });
    job.setEnv("GFLOW_JOB_TOKEN", "");
    job.start();
    std::string local;
    for (int i = 0; i < 500 && local.empty(); ++i) {
      local = listeningAddress(job.port());
      if (local.empty()) std::this_thread::sleep_for(milliseconds(10));
    }
    EXPECT_EQ(local.substr(0, 8), "0100007F") << "the store listens on " << local;
    ASSERT_TRUE(job.waitExit(seconds(20))) << job.report();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(job.result(r).exitCode, 0) << job.report();
    EXPECT_NE(job.result(0).err.find("this job has no token"), std::string::npos)
        << job.result(0).err;
    EXPECT_EQ(job.result(1).err.find("this job has no token"), std::string::npos);
  }
  {
    Job job(2, [](int) { return std::vector<std::string>{"loop", "2", "1024"}; });
    job.setEnv("GFLOW_JOB_TOKEN", "");
    job.setEnv("GFLOW_REQUIRE_TOKEN", "1");
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(20))) << job.report();
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(job.result(r).exitCode, 0) << job.report();
      EXPECT_NE(job.result(r).what.find("GFLOW_REQUIRE_TOKEN"), std::string::npos) << job.report();
    }
  }
}

}  // namespace
