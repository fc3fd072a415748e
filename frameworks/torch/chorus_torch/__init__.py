"""Chorus as a torch.distributed backend.

    pip install --no-build-isolation ./frameworks/torch   # registers "chorus" through an entry point
    torch.distributed.init_process_group("chorus")         # or "cpu:chorus,cuda:nccl"

Installed with pip, the package declares a ``torch.distributed.backends`` entry point, so torch
registers the backend the first time a process names it: a spawned rank needs no ``import
chorus_torch``. From a build tree (``PYTHONPATH=<build>/python``) import it once per process.

Collectives on CPU tensors run through Chorus (shared memory between the processes of a host,
TCP, UCX or RDMA verbs between hosts). The c10d store only carries each group's Chorus unique id,
made by the group's rank 0: after that, data never goes through the store. See docs/frameworks.md.
"""
import os
import socket

import torch.distributed as dist

from . import _C

__all__ = ["create_backend", "register", "version", "TORCH_VERSION"]

# The torch release this extension was compiled against (its C++ ABI is that release's only).
TORCH_VERSION = "@CHORUS_TORCH_VERSION@"


def version():
    """Chorus's version as major*10000 + minor*100 + patch."""
    return _C.version()


def _bootstrap_address():
    """The address this host reaches MASTER_ADDR from, for the unique id's store to listen on.

    Chorus's unique id listens on CHORUS_BOOTSTRAP_ADDR, by default 127.0.0.1 (this host only).
    When the job has a non-loopback MASTER_ADDR, the group's rank 0 may be on any host: it listens
    on the address of its interface towards MASTER_ADDR, which the other hosts reach too.
    """
    master = os.environ.get("MASTER_ADDR", "")
    if not master or os.environ.get("CHORUS_BOOTSTRAP_ADDR"):
        return None
    try:
        infos = socket.getaddrinfo(master, None, proto=socket.IPPROTO_UDP)
        family, _, _, _, addr = infos[0]
        if addr[0].startswith("127.") or addr[0] == "::1":
            return None
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr[0], 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
    except OSError:
        return None


def create_backend(dist_options, backend_options=None):
    """The backend's creator, as torch.distributed calls it for every group (extended API)."""
    if dist_options.group_rank == 0:
        address = _bootstrap_address()
        if address:
            os.environ["CHORUS_BOOTSTRAP_ADDR"] = address
    timeout = dist_options.timeout
    if backend_options is not None and getattr(backend_options, "_timeout", None) is not None:
        timeout = backend_options._timeout
    return _C.ProcessGroupChorus(dist_options.store, dist_options.group_rank, dist_options.group_size,
                                 timeout, dist_options.group_id or "")


def register():
    """Registers the backend "chorus" for CPU and CUDA devices (once per process)."""
    if "CHORUS" not in dist.Backend._plugins:
        dist.Backend.register_backend("chorus", create_backend, extended_api=True, devices=["cpu", "cuda"])


register()
