// Communicator::join and grow: a new process joins a running job
// (docs/elastic.md).
//
// Through the job's store, under "gflow/join/": a joiner takes a number
// (`arrived`, the store's atomic add) and waits for its admission under that
// number. grow() is collective over the members: their rank 0 takes every
// joiner that has arrived and not yet been admitted (moving `admitted` on
// by the store's add, so no joiner is admitted twice), tells the members by
// a broadcast over the communicator (no store request on the other ranks),
// and writes each joiner's admission: the new communicator's store prefix,
// its rank (after the members') and the new size. Everyone then connects
// as split() and shrink() do; the creation-time agreement checks that the
// joiners' settings match. What keeps strangers out is the job token: the
// store and every data connection demand it.
#include <algorithm>
#include <charconv>

#include "bootstrap/attendance.h"
#include "bootstrap/environment.h"
#include "common/check.h"
#include "common/fd_limit.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/socket.h"
#include "core/communicator_impl.h"
#include "core/verdict.h"
#include "transport/contract.h"

namespace gflow {

namespace {

const char* const kArrived = "gflow/join/arrived";
const char* const kAdmitted = "gflow/join/admitted";
constexpr size_t kMaxAdmission = 4096;
constexpr int64_t kMaxJoinersPerGrow = 4096;    // more wait for the next grow()
constexpr int64_t kMaxSize = int64_t(1) << 24;  // GFLOW_WORLD_SIZE's range

// Joiner n's ticket, decided once (bootstrap::decideOnce): "admitted" by
// the members' rank 0, or "withdrawn" by a joiner that gave up waiting.
std::string ticketKey(int64_t joiner) {
  return "gflow/join/" + std::to_string(joiner) + "/ticket";
}
// An admitted joiner's place: "<prefix>\n<rank>\n<size>".
std::string admissionKey(int64_t joiner) {
  return "gflow/join/" + std::to_string(joiner) + "/admission";
}

// The job's store as a joiner reaches it: the caller's, else a client of
// Options::root or GFLOW_ROOT with the job token.
std::shared_ptr<Store> joinerStore(const Options& o, const std::string& token,
                                   std::chrono::milliseconds timeout) {
  if (o.store) return o.store;
  const std::string root = !o.root.empty() ? o.root : params::root();
  if (root.empty()) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("join"))
        << "join(): no store to join through: set GFLOW_ROOT=host:port (the job's store) or "
           "Options::root or Options::store";
  }
  const auto hp = net::parseHostPort(root, o.root.empty() ? "GFLOW_ROOT" : "Options::root");
  TcpStoreOptions so;
  so.host = hp.first;
  so.port = hp.second;
  so.token = token;
  so.timeout = timeout;
  return std::make_shared<TcpStore>(so);
}

struct Admission {
  std::string prefix;
  int rank = -1;
  int size = -1;
};

// A whole decimal field of `v` from `at` up to `end` (npos: the end).
int64_t field(const std::string& v, size_t at, size_t end) {
  if (end == std::string::npos) end = v.size();
  int64_t x = -1;
  const auto r = std::from_chars(v.data() + at, v.data() + end, x);
  return r.ec == std::errc() && r.ptr == v.data() + end ? x : -1;
}

// What the members' rank 0 wrote for joiner `number`; checked like any
// value the store holds (a token holder wrote it).
Admission parseAdmission(const std::string& v, int64_t number) {
  Admission a;
  const size_t n1 = v.find('\n'), n2 = n1 == std::string::npos ? n1 : v.find('\n', n1 + 1);
  if (v.size() <= kMaxAdmission && n2 != std::string::npos && v.rfind("gflow/", 0) == 0) {
    a.prefix = v.substr(0, n1);
    const int64_t r = field(v, n1 + 1, n2), n = field(v, n2 + 1, std::string::npos);
    if (n >= 2 && n <= kMaxSize && r >= 1 && r < n) {
      a.rank = static_cast<int>(r);
      a.size = static_cast<int>(n);
    }
  }
  if (a.size < 0) {
    GFLOW_THROW(kInternal, ErrorContext::forOp("join"))
        << "join(): the admission of joiner " << number << " in the store is malformed ('"
        << transport::printable(v.data(), std::min<size_t>(v.size(), 80)) << "')";
  }
  return a;
}

// Joiner `number`'s admission, or kTimeout once it withdrew.
Admission awaitAdmission(Store& store, int64_t number, std::chrono::milliseconds timeout) {
  try {
    store.getString(ticketKey(number), timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
    if (bootstrap::decideOnce(store, ticketKey(number), "withdrawn", timeout) == "withdrawn") {
      GFLOW_THROW(kTimeout, ErrorContext::forOp("join"))
          << "join(): no grow() admitted joiner " << number << " within " << timeout.count()
          << " ms (GFLOW_TIMEOUT); it withdrew";
    }
  }
  return parseAdmission(store.getString(admissionKey(number), timeout), number);
}

}  // namespace

std::shared_ptr<Communicator> Communicator::join(const Options& options) {
  fdlimit::raiseToHard();
  const Settings settings = resolveSettings(options);
  const std::chrono::milliseconds timeout = timeoutOf(options);
  bootstrap::Identity id;
  id.token = !options.token.empty() ? options.token : params::jobToken();
  checkAuthenticated(id, false);
  std::shared_ptr<Store> store = joinerStore(options, id.token, timeout);
  const int64_t number = store->add(kArrived, 1);
  GFLOW_LOG(INFO) << "join: waiting for admission as joiner " << number;
  const Admission a = awaitAdmission(*store, number, timeout);
  id.rank = a.rank;
  id.size = a.size;
  auto impl = CommunicatorImpl::connect(
      CommunicatorImpl::planFor(options, settings, id, std::move(store), a.prefix));
  GFLOW_LOG(INFO) << "join: rank " << a.rank << " of " << a.size;
  return std::shared_ptr<Communicator>(std::move(impl));
}

std::shared_ptr<Communicator> Communicator::grow() {
  return impl(*this).growBy();
}

std::vector<int64_t> CommunicatorImpl::admitJoiners(const std::string& prefix) {
  Store& store = *contextOptions.store;
  const int64_t arrived = store.add(kArrived, 0), passed = store.add(kAdmitted, 0);
  const int64_t waiting = arrived < 0 || passed < 0 || passed >= arrived
                              ? 0
                              : std::min({arrived - passed, kMaxJoinersPerGrow, kMaxSize - size});
  if (waiting <= 0) return {};
  // The numbers this add moves `admitted` over are this grow's alone; of
  // those, the joiners still waiting (not withdrawn) are admitted.
  const int64_t first = store.add(kAdmitted, waiting) - waiting + 1;
  std::vector<int64_t> admitted;
  for (int64_t n = first; n < first + waiting; ++n) {
    if (bootstrap::decideOnce(store, ticketKey(n), "admitted", timeout) == "admitted") {
      admitted.push_back(n);
    }
  }
  const int64_t newSize = size + static_cast<int64_t>(admitted.size());
  for (size_t i = 0; i < admitted.size(); ++i) {
    store.setString(admissionKey(admitted[i]),
                    prefix + "\n" + std::to_string(size + i) + "\n" + std::to_string(newSize));
  }
  return admitted;
}

std::shared_ptr<Communicator> CommunicatorImpl::growBy() {
  checkUsable("grow");
  const ErrorContext ctx = ErrorContext::forOp("grow").withRank(rank);
  const std::string prefix = contextOptions.prefix + "grow" + std::to_string(growCount++) + "/";
  // How many joiners rank 0 admitted, for everyone (-1: its store failed).
  int64_t joiners = 0;
  std::shared_ptr<const Error> failed;
  if (rank == 0) {
    try {
      joiners = static_cast<int64_t>(admitJoiners(prefix).size());
    } catch (const Error& e) {
      failed = std::make_shared<Error>(relabel(e, ctx));
      joiners = -1;
    }
  }
  broadcast(Tensor(&joiners, 1, DataType::kInt64), 0);
  if (failed) throw *failed;
  if (joiners < 0) GFLOW_THROW(kInternal, ctx) << "grow(): rank 0 could not read the join line";
  if (joiners == 0) return nullptr;
  transport::ContextOptions co = contextOptions;
  co.size = size + static_cast<int>(joiners);
  co.prefix = prefix;
  try {
    return std::shared_ptr<Communicator>(connect({co, transportName, settings, hostOf[rank]}));
  } catch (const Error& e) {
    throw relabel(e, ctx);
  }
}

}  // namespace gflow
