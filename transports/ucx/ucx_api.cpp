#include "transports/ucx/ucx_api.hpp"

#include "transports/dl_library.hpp"

namespace chorus::transport {

namespace {

LoadedApi<UcxApi> loadUcx() {
  LoadedApi<UcxApi> l;
  DlLibrary lib({"libucp.so.0"}, "install UCX, e.g. Debian's libucx0", "UCX older than 1.10?");
  UcxApi& a = l.api;
  lib.resolve("ucp_config_read", a.config_read);
  lib.resolve("ucp_config_release", a.config_release);
  lib.resolve("ucp_config_modify", a.config_modify);
  lib.resolve("ucp_init_version", a.init_version);
  lib.resolve("ucp_cleanup", a.cleanup);
  lib.resolve("ucp_get_version_string", a.get_version_string);
  lib.resolve("ucp_worker_create", a.worker_create);
  lib.resolve("ucp_worker_destroy", a.worker_destroy);
  lib.resolve("ucp_worker_get_address", a.worker_get_address);
  lib.resolve("ucp_worker_release_address", a.worker_release_address);
  lib.resolve("ucp_worker_progress", a.worker_progress);
  lib.resolve("ucp_worker_get_efd", a.worker_get_efd);
  lib.resolve("ucp_worker_arm", a.worker_arm);
  lib.resolve("ucp_ep_create", a.ep_create);
  lib.resolve("ucp_ep_close_nbx", a.ep_close_nbx);
  lib.resolve("ucp_ep_flush_nbx", a.ep_flush_nbx);
  lib.resolve("ucp_stream_send_nbx", a.stream_send_nbx);
  lib.resolve("ucp_stream_recv_nbx", a.stream_recv_nbx);
  lib.resolve("ucp_tag_send_nbx", a.tag_send_nbx);
  lib.resolve("ucp_tag_recv_nbx", a.tag_recv_nbx);
  lib.resolve("ucp_tag_probe_nb", a.tag_probe_nb);
  lib.resolve("ucp_tag_msg_recv_nbx", a.tag_msg_recv_nbx);
  lib.resolve("ucp_request_check_status", a.request_check_status);
  lib.resolve("ucp_request_free", a.request_free);
  // ucs_status_string lives in libucs, a dependency of libucp: dlsym on the handle searches it too.
  lib.resolve("ucs_status_string", a.status_string);
  l.why = lib.error();
  return l;
}

}  // namespace

const UcxApi* UcxApi::get(std::string* why) {
  static const LoadedApi<UcxApi> loaded = loadUcx();
  return loaded.get(why);
}

}  // namespace chorus::transport
