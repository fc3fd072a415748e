#include "transports/ucx/ucx_api.hpp"

#include <dlfcn.h>

#include <mutex>

#include "base/util.hpp"

namespace chorus::transport {

namespace {

struct Loaded {
  UcxApi api{};
  std::string why;  // empty when loaded
};

template <class F>
bool loadOne(void* lib, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn && why.empty()) why = strCat("libucp.so.0 has no ", name, " (UCX older than 1.10?)");
  return fn != nullptr;
}

Loaded load() {
  Loaded l;
  // RTLD_LOCAL: UCX's symbols stay out of the global namespace of the program using Chorus.
  void* lib = ::dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    l.why =
        strCat("cannot load libucp.so.0 (install UCX, e.g. Debian's libucx0): ", err ? err : "dlopen failed");
    return l;
  }
  UcxApi& a = l.api;
  std::string& w = l.why;
  loadOne(lib, "ucp_config_read", a.config_read, w);
  loadOne(lib, "ucp_config_release", a.config_release, w);
  loadOne(lib, "ucp_config_modify", a.config_modify, w);
  loadOne(lib, "ucp_init_version", a.init_version, w);
  loadOne(lib, "ucp_cleanup", a.cleanup, w);
  loadOne(lib, "ucp_get_version_string", a.get_version_string, w);
  loadOne(lib, "ucp_worker_create", a.worker_create, w);
  loadOne(lib, "ucp_worker_destroy", a.worker_destroy, w);
  loadOne(lib, "ucp_worker_get_address", a.worker_get_address, w);
  loadOne(lib, "ucp_worker_release_address", a.worker_release_address, w);
  loadOne(lib, "ucp_worker_progress", a.worker_progress, w);
  loadOne(lib, "ucp_worker_get_efd", a.worker_get_efd, w);
  loadOne(lib, "ucp_worker_arm", a.worker_arm, w);
  loadOne(lib, "ucp_ep_create", a.ep_create, w);
  loadOne(lib, "ucp_ep_close_nbx", a.ep_close_nbx, w);
  loadOne(lib, "ucp_ep_flush_nbx", a.ep_flush_nbx, w);
  loadOne(lib, "ucp_stream_send_nbx", a.stream_send_nbx, w);
  loadOne(lib, "ucp_stream_recv_nbx", a.stream_recv_nbx, w);
  loadOne(lib, "ucp_tag_send_nbx", a.tag_send_nbx, w);
  loadOne(lib, "ucp_tag_recv_nbx", a.tag_recv_nbx, w);
  loadOne(lib, "ucp_tag_probe_nb", a.tag_probe_nb, w);
  loadOne(lib, "ucp_tag_msg_recv_nbx", a.tag_msg_recv_nbx, w);
  loadOne(lib, "ucp_request_check_status", a.request_check_status, w);
  loadOne(lib, "ucp_request_free", a.request_free, w);
  // ucs_status_string lives in libucs, a dependency of libucp: dlsym on the handle searches it too.
  loadOne(lib, "ucs_status_string", a.status_string, w);
  // The library stays loaded for the life of the process (UCX does not support unloading well).
  return l;
}

}  // namespace

const UcxApi* UcxApi::get(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.why.empty()) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace chorus::transport
