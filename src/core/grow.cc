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
#include <cstdlib>

#include "bootstrap/environment.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/socket.h"
#include "core/communicator_impl.h"

namespace gflow {

namespace {

const char* const kArrived = "gflow/join/arrived";
const char* const kAdmitted = "gflow/join/admitted";
constexpr size_t kMaxAdmission = 4096;

std::string admissionKey(int64_t joiner) {
  return "gflow/join/" + std::to_string(joiner) + "/admit";
}

// The job's store as a joiner reaches it: the caller's, else a client of
// Options::root or GFLOW_ROOT with the job token.
std::shared_ptr<Store> joinerStore(const Options& o, std::chrono::milliseconds timeout) {
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
  so.token = !o.token.empty() ? o.token : params::jobToken();
  so.timeout = timeout;
  return std::make_shared<TcpStore>(so);
}

struct Admission {
  std::string prefix;
  int rank = -1;
  int size = -1;
};

// "<prefix>\n<rank>\n<size>", written by the members' rank 0; checked like
// any value a store holds (a token holder wrote it).
Admission parseAdmission(const std::string& v) {
  Admission a;
  const size_t n1 = v.find('\n'), n2 = n1 == std::string::npos ? n1 : v.find('\n', n1 + 1);
  if (v.size() <= kMaxAdmission && n2 != std::string::npos && v.rfind("gflow/", 0) == 0) {
    a.prefix = v.substr(0, n1);
    a.rank = std::atoi(v.c_str() + n1 + 1);
    a.size = std::atoi(v.c_str() + n2 + 1);
  }
  if (a.size < 2 || a.rank < 1 || a.rank >= a.size) {
    GFLOW_THROW(kInternal, ErrorContext::forOp("join"))
        << "join(): the admission in the store is malformed ('"
        << v.substr(0, std::min<size_t>(v.size(), 80)) << "')";
  }
  return a;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::join(const Options& options) {
  const Settings settings = resolveSettings(options);
  const std::chrono::milliseconds timeout = options.timeout.count() > 0
                                                ? options.timeout
                                                : std::chrono::milliseconds(params::timeoutMs());
  std::shared_ptr<Store> store = joinerStore(options, timeout);
  const int64_t number = store->add(kArrived, 1);
  GFLOW_LOG(INFO) << "join: waiting for admission as joiner " << number;
  const Admission a = parseAdmission(store->getString(admissionKey(number), timeout));
  transport::ContextOptions co;
  co.rank = a.rank;
  co.size = a.size;
  co.store = store;
  co.prefix = a.prefix;
  co.token = !options.token.empty() ? options.token : params::jobToken();
  co.timeout = timeout;
  co.connect = settings.connect;
  co.tcp = options.tcp;
  co.verbs = options.verbs;
  co.localSingleCopy = settings.shm;
  const std::string transportName =
      !options.transport.empty() ? options.transport : params::transport();
  const std::string host = !options.hostId.empty() ? options.hostId : bootstrap::hostId();
  co.hostHash = hash::sha256Id(host);
  auto impl = CommunicatorImpl::connect({co, transportName, settings, co.hostHash});
  GFLOW_LOG(INFO) << "join: rank " << a.rank << " of " << a.size;
  return std::shared_ptr<Communicator>(std::move(impl));
}

std::shared_ptr<Communicator> Communicator::grow() {
  return impl(*this).growBy();
}

std::shared_ptr<Communicator> CommunicatorImpl::growBy() {
  checkUsable("grow");
  // [first joiner's number, how many]: rank 0's count, for everyone.
  std::vector<int64_t> admit(2, 0);
  const std::shared_ptr<Store>& store = contextOptions.store;
  if (rank == 0) {
    const int64_t waiting = store->add(kArrived, 0) - store->add(kAdmitted, 0);
    if (waiting > 0) {  // the range this add moved `admitted` over is this grow's alone
      admit[0] = store->add(kAdmitted, waiting) - waiting + 1;
      admit[1] = waiting;
    }
  }
  broadcast(Tensor(admit.data(), admit.size(), DataType::kInt64), 0);
  if (admit[1] == 0) return nullptr;
  const int newSize = size + static_cast<int>(admit[1]);
  const std::string prefix = contextOptions.prefix + "grow" + std::to_string(growCount++) + "/";
  if (rank == 0) {
    for (int64_t j = 0; j < admit[1]; ++j) {
      store->setString(admissionKey(admit[0] + j),
                       prefix + "\n" + std::to_string(size + j) + "\n" + std::to_string(newSize));
    }
  }
  transport::ContextOptions co = contextOptions;
  co.size = newSize;
  co.prefix = prefix;
  return std::shared_ptr<Communicator>(connect({co, transportName, settings, hostOf[rank]}));
}

}  // namespace gflow
