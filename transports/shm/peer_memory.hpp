// Reading (and writing) another process's memory on this host in place: cross-memory attach
// (process_vm_readv, process_vm_writev), which copies straight between a peer's pages and ours in
// one pass, with no shared mapping and no staging copy. Linux allows it where the reader may ptrace the peer
// (same user and no Yama restriction, or CAP_SYS_PTRACE); elsewhere it fails with EPERM, which `probe`
// detects once at set-up so that collectives fall back to staging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus::transport {

/// The word every process publishes the address of, for its peers' probes.
const uint64_t* peerProbeWord();
/// The value at that word (the same in every process of this library).
constexpr uint64_t kPeerProbeValue = 0x43484f5255534342ull;  // "CHORUSCB"

/// A random number drawn once per process. Two ranks are in one address space exactly when they
/// publish the same process id and the same nonce: ids alone can collide across pid namespaces,
/// and a process forked after drawing shares the nonce but not the id.
uint64_t processNonce();

/// Whether this process may read process `pid`'s memory: reads the probe word at `address` there.
/// On failure `*why` (if given) tells the cause ("process 123 refused it: Operation not permitted
/// (EPERM: ...)").
bool probePeerMemory(int pid, uint64_t address, std::string* why = nullptr);

/// How fast cross-memory attach copies on this machine, relative to memcpy: this process reads
/// `bytes` of its own heap through process_vm_readv (the kernel's path for a peer's memory) and
/// copies them with memcpy, best of a few interleaved rounds each; returns memcpy's time / the
/// read's time (0.25: the read moves bytes at a quarter of memcpy's rate), or 0 where the read is
/// refused. About 3 ms for 4 MiB. Single copy of heap buffers saves one of staging's two copies, so
/// it pays only where this is well above 0.5 (docs/performance.md, "Single copy").
double measurePeerReadSpeed(size_t bytes = size_t{4} << 20);

/// Copies `bytes` from address `remote` of process `pid` to `local` (a loop over partial reads).
/// Throws chorus::Error (chorusSystemError) naming `what`, the process and errno where the system
/// refuses: the peer exited (ESRCH), the range is not mapped there (EFAULT), permission (EPERM).
void readPeerMemory(int pid, void* local, uint64_t remote, size_t bytes, const char* what);

/// Copies `bytes` from `local` to address `remote` of process `pid` (process_vm_writev, a loop over
/// partial writes). The same permission as reading (Linux checks ptrace access either way); fails
/// as readPeerMemory does.
void writePeerMemory(int pid, uint64_t remote, const void* local, size_t bytes, const char* what);

/// Whether this process may write memory by cross-memory attach: one process_vm_writev into its
/// own memory, which a seccomp filter or a kernel without the call refuses (permission to a peer is
/// the read probe's: the kernel checks the same ptrace access for both). On failure `*why` says why.
bool probeOwnMemoryWrite(std::string* why = nullptr);

}  // namespace chorus::transport
