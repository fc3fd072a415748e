#include "transports/ib/verbs_api.hpp"

#include "transports/dl_library.hpp"

namespace chorus::transport {

namespace {

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int pollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }

LoadedApi<VerbsApi> loadVerbs() {
  LoadedApi<VerbsApi> l;
  DlLibrary lib({"libibverbs.so.1"}, "install rdma-core's libibverbs1");
  VerbsApi& a = l.api;
  lib.resolve("ibv_get_device_list", a.get_device_list);
  lib.resolve("ibv_free_device_list", a.free_device_list);
  lib.resolve("ibv_get_device_name", a.get_device_name);
  lib.resolve("ibv_open_device", a.open_device);
  lib.resolve("ibv_close_device", a.close_device);
  lib.resolve("ibv_query_port", a.query_port);
  lib.resolve("ibv_query_gid", a.query_gid);
  lib.resolve("ibv_alloc_pd", a.alloc_pd);
  lib.resolve("ibv_dealloc_pd", a.dealloc_pd);
  lib.resolve("ibv_reg_mr", a.reg_mr);
  lib.resolve("ibv_dereg_mr", a.dereg_mr);
  lib.resolve("ibv_create_cq", a.create_cq);
  lib.resolve("ibv_destroy_cq", a.destroy_cq);
  lib.resolve("ibv_create_qp", a.create_qp);
  lib.resolve("ibv_destroy_qp", a.destroy_qp);
  lib.resolve("ibv_modify_qp", a.modify_qp);
  a.post_send = postSend;
  a.post_recv = postRecv;
  a.poll_cq = pollCq;
  l.why = lib.error();
  return l;
}

}  // namespace

const VerbsApi* VerbsApi::system(std::string* why) {
  static const LoadedApi<VerbsApi> loaded = loadVerbs();
  return loaded.get(why);
}

}  // namespace chorus::transport
