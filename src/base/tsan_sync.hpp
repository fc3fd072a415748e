// ThreadSanitizer annotations for synchronisation through shared memory.
//
// Ranks of one process (thread ranks) map each other's shared segments at different addresses, so
// ThreadSanitizer cannot pair a release store to a flag in one mapping with the acquire load of the
// same flag through another, and reports the data that the flag protects (zero-copy buffers are
// read at their owner's address) as races. Around each such synchronisation Chorus tells TSan about
// the edge on one process-wide address. Compiled to nothing without TSan.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define CHORUS_TSAN_ANNOTATE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CHORUS_TSAN_ANNOTATE 1
#endif
#endif

#ifdef CHORUS_TSAN_ANNOTATE
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace chorus {

#ifdef CHORUS_TSAN_ANNOTATE
inline char gShmSyncToken;
/// Before publishing a flag that peers acquire through shared memory.
inline void tsanReleaseShm() { __tsan_release(&gShmSyncToken); }
/// After observing the peers' flags.
inline void tsanAcquireShm() { __tsan_acquire(&gShmSyncToken); }
#else
inline void tsanReleaseShm() {}
inline void tsanAcquireShm() {}
#endif

}  // namespace chorus
