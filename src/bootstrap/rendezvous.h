// Rendezvous: rank 0's store, and how every rank reaches it and learns the
// job token (docs/launching.md, "Which source wins").
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bootstrap/environment.h"
#include "gflow/store.h"

namespace gflow::bootstrap {

// Opens rank 0's store (server on rank 0, client elsewhere) for `id`:
//   - at id's root address when one was given (Options::root, GFLOW_ROOT,
//     MASTER_ADDR/MASTER_PORT);
//   - under a PMIx launcher without one (id.pmix), rank 0's store listens on
//     the data interface (`ifname`, GFLOW_SOCKET_IFNAME syntax) on a port the
//     kernel picks, and rank 0 shares that address through the PMIx server.
// Under PMIx a job without a token gets one: rank 0 draws it at random and
// shares it the same way (id->token is set on every rank). What a rank was
// given itself wins for that rank; what it lacks it takes from rank 0. Under
// PMIx this is collective over every process of the PMIx job (a fence), even
// on ranks given both; when rank 0 cannot start its store, the others raise
// its reason. Under GFLOW_ROOT_EXTERNAL=1 every rank, rank 0 included, is a
// client of the store at the given address (which it needs), PMIx or not.
std::shared_ptr<Store> openStore(Identity* id, const std::string& ifname,
                                 std::chrono::milliseconds timeout);

}  // namespace gflow::bootstrap
