#include "transports/ib/verbs_api.hpp"

#include <dlfcn.h>

#include "base/util.hpp"

namespace chorus::transport {

namespace {

struct Loaded {
  VerbsApi api{};
  std::string why;  // empty when loaded
};

template <class F>
void loadOne(void* lib, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn && why.empty()) why = strCat("libibverbs.so.1 has no ", name);
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int pollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }

Loaded load() {
  Loaded l;
  void* lib = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    l.why = strCat("cannot load libibverbs.so.1 (install rdma-core's libibverbs1): ",
                   err ? err : "dlopen failed");
    return l;
  }
  VerbsApi& a = l.api;
  std::string& w = l.why;
  loadOne(lib, "ibv_get_device_list", a.get_device_list, w);
  loadOne(lib, "ibv_free_device_list", a.free_device_list, w);
  loadOne(lib, "ibv_get_device_name", a.get_device_name, w);
  loadOne(lib, "ibv_open_device", a.open_device, w);
  loadOne(lib, "ibv_close_device", a.close_device, w);
  loadOne(lib, "ibv_query_port", a.query_port, w);
  loadOne(lib, "ibv_query_gid", a.query_gid, w);
  loadOne(lib, "ibv_alloc_pd", a.alloc_pd, w);
  loadOne(lib, "ibv_dealloc_pd", a.dealloc_pd, w);
  loadOne(lib, "ibv_reg_mr", a.reg_mr, w);
  loadOne(lib, "ibv_dereg_mr", a.dereg_mr, w);
  loadOne(lib, "ibv_create_cq", a.create_cq, w);
  loadOne(lib, "ibv_destroy_cq", a.destroy_cq, w);
  loadOne(lib, "ibv_create_qp", a.create_qp, w);
  loadOne(lib, "ibv_destroy_qp", a.destroy_qp, w);
  loadOne(lib, "ibv_modify_qp", a.modify_qp, w);
  a.post_send = postSend;
  a.post_recv = postRecv;
  a.poll_cq = pollCq;
  return l;
}

}  // namespace

const VerbsApi* VerbsApi::system(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.why.empty()) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace chorus::transport
