#include "launcher/output_relay.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace chorus::launcher {

bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return false;
      continue;
    }
    return false;
  }
  return true;
}

void LineRelay::feed(std::string_view data) {
  std::string out;
  while (!data.empty()) {
    size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(data);
      size_t start = 0;
      for (; pending_.size() - start >= kMaxLineBytes; start += kMaxLineBytes) {
        out += prefix_;
        out.append(pending_, start, kMaxLineBytes);
        out += '\n';
      }
      pending_.erase(0, start);
      break;
    }
    out += prefix_;
    out += pending_;
    out.append(data.substr(0, nl + 1));
    pending_.clear();
    data.remove_prefix(nl + 1);
  }
  if (!out.empty()) writeAll(outFd_, out);
}

void LineRelay::finish() {
  if (pending_.empty()) return;
  std::string out = prefix_ + pending_ + '\n';
  pending_.clear();
  writeAll(outFd_, out);
}

}  // namespace chorus::launcher
