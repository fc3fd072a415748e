// One-sided transfers over windows (chorusWindowRegister, chorusPutSignal, chorusWaitSignal): each
// rank's buffer of a window lies in chorusMemAlloc memory, which every other rank of the host maps
// (transports/shm/shm_memory.hpp), so a put is a memcpy into the peer's mapping. Signals are
// counters in a table each rank allocates the same way at its communicator's first window:
// slot [source rank][signal], raised with an atomic add after the data (release), waited for with
// an acquire load, so the data a signal follows is visible to the waiter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "chorus/chorus.h"

namespace chorus {

class CommImpl;

namespace onesided {

/// A communicator's signal tables and windows; made by its first window, freed with its handle
/// (which frees the windows left registered).
class State;

/// Collective: registers every rank's [buff, buff + size) as one window. `state` is made here on
/// the first call (the signal tables are exchanged in the same step).
chorusWindow_t registerWindow(const std::shared_ptr<CommImpl>& impl, std::shared_ptr<State>& state,
                              void* buff, size_t size);
/// Collective: a barrier, then the window is freed.
void deregisterWindow(const std::shared_ptr<CommImpl>& impl, State* state, chorusWindow_t win);
/// Rank `peer`'s buffer of `win` in this process.
void peerPointer(chorusWindow_t win, int peer, void** ptr, size_t* size);
void putSignal(CommImpl& impl, State* state, const void* src, size_t bytes, int peer, chorusWindow_t win,
               size_t offset, int signal);
void waitSignal(CommImpl& impl, State* state, int peer, int signal, uint64_t count);

/// Frees `state` and every window still registered in it (for the communicator's destroy).
void release(std::shared_ptr<State>& state);

}  // namespace onesided
}  // namespace chorus
