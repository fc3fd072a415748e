// Helpers shared by the store tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

#include "bootstrap/socket_util.hpp"
#include "chorus/chorus.hpp"

namespace chorus::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "chorus-store-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Runs `fn`, expecting it to throw chorus::Error with `code`; returns the message ("" on failure).
inline std::string expectError(chorusResult_t code, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected chorus::Error with code " << code;
  return "";
}

/// A local port nobody listens on right now.
inline uint16_t unusedPort() {
  auto fd = net::listenTcp("127.0.0.1", 0);
  return net::localAddress(fd.get()).port();
}

inline std::span<const std::byte> bytesOf(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::string stringOf(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace chorus::test
