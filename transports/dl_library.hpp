// A shared library loaded at run time (dlopen) instead of linked, so that libchorus runs on machines
// without it: the UCX and RDMA verbs transports load theirs this way (ucx/ucx_api.cpp,
// ib/verbs_api.cpp). The first failure is kept as text naming the library and what is missing.
#pragma once

#include <initializer_list>
#include <string>

namespace chorus::transport {

class DlLibrary {
 public:
  /// Opens the first of `names` that loads, RTLD_NOW | RTLD_LOCAL (its symbols stay out of the
  /// global namespace of the program using Chorus). Where none does, error() says "cannot load
  /// <names> (<install>): <why>". `tooOld` is what a missing symbol suggests (may be null). The
  /// library is never unloaded (UCX does not support unloading well).
  DlLibrary(std::initializer_list<const char*> names, const char* install, const char* tooOld = nullptr);
  DlLibrary(const DlLibrary&) = delete;
  DlLibrary& operator=(const DlLibrary&) = delete;

  /// Sets `fn` to the library's function `symbol`, or to null where the library has none (or did
  /// not load); the first one missing makes error() "<library> has no <symbol> (<tooOld>)".
  template <class F>
  void resolve(const char* symbol, F& fn) {
    fn = reinterpret_cast<F>(find(symbol));
  }

  /// Empty while the library is loaded and every symbol resolved so far was found.
  const std::string& error() const { return error_; }

 private:
  void* find(const char* symbol);

  void* handle_ = nullptr;
  std::string name_;  // the name it loaded by
  const char* tooOld_;
  std::string error_;
};

/// A table of functions loaded from a DlLibrary (once, into a static), or why it could not be.
template <class Api>
struct LoadedApi {
  Api api{};
  std::string why;  // empty when loaded

  /// The table, or null with the reason in `*whyNot` (when given).
  const Api* get(std::string* whyNot) const {
    if (why.empty()) return &api;
    if (whyNot) *whyNot = why;
    return nullptr;
  }
};

}  // namespace chorus::transport
