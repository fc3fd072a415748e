// Small helpers shared by the library: string building, errno text, alignment.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <string>

namespace chorus {

/// Concatenates anything streamable: strCat("rank ", 3, ": ", msg).
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// "No such file or directory (errno 2)".
inline std::string errnoText(int err) { return strCat(std::strerror(err), " (errno ", err, ")"); }

constexpr size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t divUp(size_t v, size_t a) { return (v + a - 1) / a; }

/// Human-readable byte count: 4096 -> "4 KiB".
std::string formatBytes(size_t bytes);

}  // namespace chorus
