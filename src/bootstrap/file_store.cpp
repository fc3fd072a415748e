// Store in a shared directory: one file per key.
//
// Writers never expose a partial file: they write a private temporary file and rename() it over the
// key's name, which replaces it atomically, so a reader opens either the old or the new value whole.
// add() is a read-modify-write and needs mutual exclusion across processes (and across threads, which
// flock() also separates because each call opens its own descriptor), hence the lock file.
//
// File names: "k-" + lowercase hex of the key. Hex survives any byte in a key and case-insensitive
// file systems; keys too long for a file name (NAME_MAX) become "h-" + a 128-bit hash, and those files
// start with the full key so that a read can verify it got the right one.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <random>

#include "base/socket_util.hpp"
#include "bootstrap/store_util.hpp"
#include "chorus/chorus.hpp"

namespace chorus {
namespace {

namespace fs = std::filesystem;

// Longest key stored under its hex name: "k-" + 2 * 100 characters stays far below NAME_MAX (255).
constexpr size_t kMaxPlainKeyBytes = 100;
constexpr const char kHexDigits[] = "0123456789abcdef";

void appendHex(std::string& out, uint64_t v) {
  for (int shift = 60; shift >= 0; shift -= 4) out += kHexDigits[(v >> shift) & 15];
}

uint64_t finalMix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

std::string fileNameFor(const std::string& key) {
  std::string name;
  if (key.size() <= kMaxPlainKeyBytes) {
    name = "k-";
    for (const unsigned char c : key) {
      name += kHexDigits[c >> 4];
      name += kHexDigits[c & 15];
    }
    return name;
  }
  // Two differently built 64-bit lanes; the stored key catches the (astronomically unlikely) clash.
  uint64_t a = 0xcbf29ce484222325ULL;
  uint64_t b = 0x6a09e667f3bcc908ULL ^ key.size();
  for (const unsigned char c : key) {
    a = (a ^ c) * 0x100000001b3ULL;
    b = std::rotl(b ^ c, 23) * 0x9e3779b97f4a7c15ULL;
  }
  name = "h-";
  appendHex(name, finalMix(a));
  appendHex(name, finalMix(b ^ a));
  return name;
}

bool isHashedName(const std::string& name) { return name.starts_with("h-"); }

// Holds an exclusive flock() on a file for its lifetime.
class FileLock {
 public:
  FileLock(const fs::path& path, const std::string& where) {
    fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd_)
      throw Error(chorusSystemError, net::errnoText(where + ": open lock file " + path.string(), errno));
    while (::flock(fd_.get(), LOCK_EX) < 0) {
      if (errno != EINTR)
        throw Error(chorusSystemError, net::errnoText(where + ": flock " + path.string(), errno));
    }
  }
  // Closing the descriptor releases the lock.

 private:
  net::Fd fd_;
};

class FileStore final : public Store {
 public:
  explicit FileStore(const std::string& directory) : dir_(directory), where_("file store " + directory) {
    if (directory.empty()) throw Error(chorusInvalidArgument, "file store: empty directory name");
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw Error(chorusSystemError, where_ + ": cannot create the directory: " + ec.message());
    if (!fs::is_directory(dir_, ec)) throw Error(chorusSystemError, where_ + ": not a directory");
  }

  void set(const std::string& key, std::span<const std::byte> value) override {
    detail::validateKey(where_, key);
    detail::validateValue(where_, key, value.size());
    write(key, value, "set(" + detail::quoteKey(key) + ")");
  }

  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    detail::validateKey(where_, key);
    const auto deadline = detail::deadlineAfter(timeout);
    detail::Backoff backoff(std::chrono::microseconds(100), std::chrono::milliseconds(10));
    for (;;) {
      if (auto value = read(key)) return std::move(*value);
      if (!backoff.sleep(deadline)) detail::throwGetTimeout(where_, key, timeout);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    detail::validateKey(where_, key);
    FileLock lock(dir_ / "lock", where_);
    const auto current = read(key);
    const auto update = detail::applyAdd(current ? &*current : nullptr, delta);
    const std::string what = detail::describeAdd(key, delta);
    if (!update.refusal.empty())
      throw Error(chorusInvalidArgument, where_ + ": " + what + ": " + update.refusal);
    write(key, detail::formatCounter(update.value), what);
    return update.value;
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) detail::validateKey(where_, key);
    for (const auto& key : keys) {
      struct stat st {};
      const auto path = dir_ / fileNameFor(key);
      if (::stat(path.c_str(), &st) == 0) continue;
      if (errno == ENOENT) return false;
      throw Error(
          chorusSystemError,
          net::errnoText(where_ + ": check(" + detail::quoteKey(key) + "): stat " + path.string(), errno));
    }
    return true;
  }

  bool erase(const std::string& key) override {
    detail::validateKey(where_, key);
    const auto path = dir_ / fileNameFor(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw Error(
        chorusSystemError,
        net::errnoText(where_ + ": erase(" + detail::quoteKey(key) + "): unlink " + path.string(), errno));
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    detail::pollWait(*this, keys, timeout, where_);
  }

 private:
  // Temporary names start with '.', which no key file does, and are unique across threads, processes
  // and hosts sharing the directory (the pid alone is not unique across hosts).
  fs::path temporaryPath() const {
    static const uint64_t processTag = [] {
      std::random_device rd;
      return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    static std::atomic<uint64_t> counter{0};
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false positive) on "lit" + string.
    std::string name = ".tmp-";
    name += std::to_string(::getpid());
    name += '-';
    appendHex(name, processTag);
    name += '-';
    name += std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
    return dir_ / name;
  }

  void write(const std::string& key, std::span<const std::byte> value, const std::string& what) {
    const std::string name = fileNameFor(key);
    std::byte keyLength[4];
    std::vector<iovec> parts;
    if (isHashedName(name)) {
      const auto n = static_cast<uint32_t>(key.size());
      for (int i = 0; i < 4; ++i) keyLength[i] = static_cast<std::byte>(n >> (8 * i));
      parts.push_back({keyLength, sizeof(keyLength)});
      parts.push_back({const_cast<char*>(key.data()), key.size()});
    }
    if (!value.empty()) parts.push_back({const_cast<std::byte*>(value.data()), value.size()});

    const fs::path tmp = temporaryPath();
    const fs::path path = dir_ / name;
    const auto fail = [&](const std::string& step) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw Error(chorusSystemError, net::errnoText(where_ + ": " + what + ": " + step, err));
    };
    net::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) fail("create " + tmp.string());
    size_t first = 0;
    while (first < parts.size()) {
      const ssize_t n = ::writev(fd.get(), &parts[first], static_cast<int>(parts.size() - first));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write " + tmp.string());
      }
      auto left = static_cast<size_t>(n);
      while (first < parts.size() && left >= parts[first].iov_len) left -= parts[first++].iov_len;
      if (first < parts.size()) {
        parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
        parts[first].iov_len -= left;
      }
    }
    // On network file systems close() is where delayed write errors surface.
    if (::close(fd.release()) < 0) fail("close " + tmp.string());
    if (::rename(tmp.c_str(), path.c_str()) < 0) fail("rename " + tmp.string() + " to " + path.string());
  }

  std::optional<std::vector<std::byte>> read(const std::string& key) {
    const std::string name = fileNameFor(key);
    const fs::path path = dir_ / name;
    const auto fail = [&](const std::string& step) -> std::optional<std::vector<std::byte>> {
      throw Error(chorusSystemError,
                  net::errnoText(
                      where_ + ": get(" + detail::quoteKey(key) + "): " + step + " " + path.string(), errno));
    };
    net::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT) return std::nullopt;
      return fail("open");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) < 0) return fail("fstat");
    // The file is never modified in place (only replaced), so its size is final once opened.
    std::vector<std::byte> data(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail("read");
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
    if (!isHashedName(name)) return data;

    const auto corrupt = [&](const std::string& why) {
      return Error(chorusRemoteError,
                   where_ + ": get(" + detail::quoteKey(key) + "): " + path.string() + " " + why);
    };
    if (data.size() < 4) throw corrupt("is truncated");
    uint32_t storedLength = 0;
    for (int i = 0; i < 4; ++i) storedLength |= static_cast<uint32_t>(data[i]) << (8 * i);
    if (storedLength > data.size() - 4) throw corrupt("is truncated");
    const std::string stored(reinterpret_cast<const char*>(data.data() + 4), storedLength);
    if (stored != key) {
      throw Error(chorusInternalError, where_ + ": keys " + detail::quoteKey(key) + " and " +
                                           detail::quoteKey(stored) + " hash to the same file " +
                                           path.string());
    }
    data.erase(data.begin(), data.begin() + 4 + storedLength);
    return data;
  }

  const fs::path dir_;
  const std::string where_;
};

}  // namespace

std::shared_ptr<Store> makeFileStore(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace chorus
