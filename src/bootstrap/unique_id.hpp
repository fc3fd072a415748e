// chorusUniqueId: the address of a bootstrap store served by the process that made the id.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chorus/chorus.h"
#include "chorus/store.hpp"

namespace chorus {

/// What a chorusUniqueId names: the store server's address, the id's own key prefix and the secret
/// that the server requires of its clients (so the id is all a rank needs, and all an intruder lacks).
struct UniqueIdAddress {
  std::string host;
  uint16_t port = 0;
  std::string nonce;
  std::string secret;
};
/// Decodes the text in `id` (pure; connects to nothing). std::nullopt if `id` is not one of ours.
std::optional<UniqueIdAddress> parseUniqueId(const chorusUniqueId& id);
/// Encodes `address` into `id`; false if it does not fit (or a field is empty or contains a space).
bool formatUniqueId(const UniqueIdAddress& address, chorusUniqueId* id);

/// Starts (once per call) a store server in this process and describes it in `id`.
void makeUniqueId(chorusUniqueId* id);
/// Connects to the store named by `id` within `timeout` (the handshake included); throws
/// chorusInvalidArgument if `id` is not one, or names a server that is not its Chorus store (stale,
/// altered, or another program's port), chorusTimeout if the store does not answer in time.
std::shared_ptr<Store> storeForUniqueId(const chorusUniqueId& id, std::chrono::milliseconds timeout);

}  // namespace chorus
