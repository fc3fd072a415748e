// Line-buffered relay of a child's output stream to one of chorusrun's own streams.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace chorus::launcher {

/// Writes all of `data` to `fd`, retrying on EINTR and waiting while the descriptor is non-blocking
/// and full. Returns false when the descriptor cannot be written (for example a closed pipe).
bool writeAll(int fd, std::string_view data);

/// Collects bytes read from a child's pipe and writes them to `outFd` one whole line at a time, each
/// line preceded by `prefix`. Because every line goes out in a single writeAll from one thread, lines
/// of different relays sharing `outFd` never interleave.
class LineRelay {
 public:
  /// A pending partial line longer than this is written out as a line of its own.
  static constexpr size_t kMaxLineBytes = size_t{64} << 10;

  LineRelay(int outFd, std::string prefix) : outFd_(outFd), prefix_(std::move(prefix)) {}

  /// Adds bytes; writes every line completed by them.
  void feed(std::string_view data);
  /// Writes a pending partial line (with a newline added). Called at end of stream.
  void finish();

 private:
  int outFd_;
  std::string prefix_;
  std::string pending_;  // bytes after the last newline seen
};

}  // namespace chorus::launcher
