#include "transports/dl_library.hpp"

#include <dlfcn.h>

#include "base/util.hpp"

namespace chorus::transport {

DlLibrary::DlLibrary(std::initializer_list<const char*> names, const char* install, const char* tooOld)
    : tooOld_(tooOld) {
  std::string tried;
  const char* err = nullptr;
  for (const char* name : names) {
    handle_ = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle_) {
      name_ = name;
      return;
    }
    err = ::dlerror();
    tried += strCat(tried.empty() ? "" : " or ", name);
  }
  error_ = strCat("cannot load ", tried, " (", install, "): ", err ? err : "dlopen failed");
}

void* DlLibrary::find(const char* symbol) {
  if (!handle_) return nullptr;
  void* p = ::dlsym(handle_, symbol);
  if (!p && error_.empty())
    error_ = strCat(name_, " has no ", symbol, tooOld_ ? strCat(" (", tooOld_, ")") : std::string());
  return p;
}

}  // namespace chorus::transport
