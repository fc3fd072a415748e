// The UCP functions the UCX transport calls, loaded from libucp.so.0 at run time (dlopen), so that
// libchorus runs on machines without UCX and links no UCX library (as NCCL loads its network plugins).
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace chorus::transport {

struct UcxApi {
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_config_modify) config_modify;
  decltype(&::ucp_init_version) init_version;
  decltype(&::ucp_cleanup) cleanup;
  decltype(&::ucp_get_version_string) get_version_string;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_get_address) worker_get_address;
  decltype(&::ucp_worker_release_address) worker_release_address;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_worker_get_efd) worker_get_efd;
  decltype(&::ucp_worker_arm) worker_arm;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_ep_flush_nbx) ep_flush_nbx;
  decltype(&::ucp_stream_send_nbx) stream_send_nbx;
  decltype(&::ucp_stream_recv_nbx) stream_recv_nbx;
  decltype(&::ucp_tag_send_nbx) tag_send_nbx;
  decltype(&::ucp_tag_recv_nbx) tag_recv_nbx;
  decltype(&::ucp_tag_probe_nb) tag_probe_nb;
  decltype(&::ucp_tag_msg_recv_nbx) tag_msg_recv_nbx;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_free) request_free;
  decltype(&::ucs_status_string) status_string;

  /// The loaded functions (loaded once per process), or null with the reason in *why (library
  /// missing, or a function missing from it).
  static const UcxApi* get(std::string* why);
};

}  // namespace chorus::transport
