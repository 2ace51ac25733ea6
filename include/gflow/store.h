// The rendezvous key-value store. Ranks publish their addresses here while a
// communicator is created. gflow ships a TCP store hosted by rank 0
// (TcpStore, below), an in-process store for ranks running as threads
// (createHashStore) and a key-prefixing view (createPrefixStore); a
// framework can bring its own by implementing Store.
//
// Thread safety: implementations must allow concurrent calls from several
// threads. Every blocking call takes a timeout and throws
// gflow::Error(kTimeout) when it passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gflow/export.h"

namespace gflow {

class GFLOW_EXPORT Store {
 public:
  virtual ~Store();

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until `key` exists, then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 if absent) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists, then returns their values in order. The
  // TCP store answers it in one request; the default waits, then gets each.
  virtual std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys,
                                                     std::chrono::milliseconds timeout);
  // Sets keys[i] to values[i] for each i (the same count). The TCP store
  // does it in one request; the default sets each.
  virtual void multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::vector<uint8_t>>& values);

  // Convenience for string values.
  void setString(const std::string& key, const std::string& value);
  std::string getString(const std::string& key, std::chrono::milliseconds timeout);
};

// An in-memory store shared by ranks that run as threads of one process.
GFLOW_EXPORT std::shared_ptr<Store> createHashStore();

// A view of `base` that prefixes every key; used for sub-communicators.
GFLOW_EXPORT std::shared_ptr<Store> createPrefixStore(const std::string& prefix,
                                                      std::shared_ptr<Store> base);

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // server address (clients) / bind address (server)
  uint16_t port = 0;               // 0 on the server: pick a free port (see port())
  bool isServer = false;
  // Job secret. Requests prove knowledge of it with an HMAC-SHA256
  // challenge; it never travels in clear. Empty disables authentication.
  std::string token;
  std::chrono::milliseconds timeout{300000};  // connect / request deadline
};

// A TCP store. The server side runs the store in a background thread of the
// calling process and is also a client of itself.
class GFLOW_EXPORT TcpStore : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;

  // The port the server listens on (useful with port 0).
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gflow
