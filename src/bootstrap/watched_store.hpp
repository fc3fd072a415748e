// A store whose waits also end when some rank has published that it failed: communicator creation
// waits through it, so that a rank which fails while creating (a malformed setting, /dev/shm too
// small, ...) stops its peers at once with its own message instead of letting them wait out
// CHORUS_TIMEOUT and then report it as "not started".
#pragma once

#include <memory>
#include <string>

#include "chorus/chorus.hpp"
#include "chorus/store.hpp"

namespace chorus {

/// `inner` (the communicator's prefixed store) for rank `rank`: every get and wait also polls the
/// failure key (a few times a second) and throws chorusRemoteError with the failed rank's message.
std::shared_ptr<Store> makeWatchedStore(std::shared_ptr<Store> inner, int rank);

/// Publishes "rank <rank>: <message>" as the failure the peers' watched stores see (best effort:
/// the store may be gone too). The first failure published stays.
void publishFailure(Store& inner, int rank, const std::string& message);

/// If `store` is a watched store and some rank has published its failure, throws its report (as a
/// wait would). For a waiter that found another reason to stop: a published failure explains more.
void throwIfPeerFailed(Store& store);

/// True if `e` is a watched store's report of another rank's failure (not to be published again).
bool isPeerFailureReport(const Error& e);

}  // namespace chorus
