// The ibverbs calls the RDMA transport makes, as a table of functions: loaded from libibverbs.so.1
// at run time (so libchorus runs where rdma-core is absent), or supplied by a test's in-process
// fake (tests/unit/transport/fake_verbs.cpp), which is how the transport's logic is tested on
// machines without RDMA devices.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace chorus::transport {

struct VerbsApi {
  ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*destroy_qp)(ibv_qp* qp);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  // Data-path calls (inline functions through the provider's ops in verbs.h).
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
  int (*poll_cq)(ibv_cq* cq, int n, ibv_wc* wc);

  /// libibverbs's functions (loaded once per process), or null with the reason in *why.
  static const VerbsApi* system(std::string* why);
};

}  // namespace chorus::transport
