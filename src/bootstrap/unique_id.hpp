// chorusUniqueId: the address of a bootstrap store served by the process that made the id.
#pragma once

#include <memory>
#include <string>

#include "chorus/chorus.h"
#include "chorus/store.hpp"

namespace chorus {

/// Starts (once per call) a store server in this process and describes it in `id`.
void makeUniqueId(chorusUniqueId* id);
/// Connects to the store named by `id`; throws chorusInvalidArgument if `id` is not one.
std::shared_ptr<Store> storeForUniqueId(const chorusUniqueId& id);

}  // namespace chorus
