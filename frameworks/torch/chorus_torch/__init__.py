"""Chorus as a torch.distributed backend.

    import chorus_torch                     # registers the backend "chorus" (in every process)
    torch.distributed.init_process_group("chorus", ...)

Collectives on CPU tensors run through Chorus (shared memory between the processes of a host,
TCP, UCX or RDMA verbs between hosts). The c10d store only carries each group's Chorus unique id,
made by the group's rank 0: after that, data never goes through the store. See docs/frameworks.md.
"""
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from . import _C

__all__ = ["create_process_group", "version"]

_ID_KEY = "chorus/unique_id"


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


def create_process_group(store, rank, world_size, timeout=timedelta(minutes=30)):
    """The backend's creator, as torch.distributed calls it for every group."""
    if rank == 0:
        address = _bootstrap_address()
        if address:
            os.environ["CHORUS_BOOTSTRAP_ADDR"] = address
        uid = _C.unique_id()
        store.set(_ID_KEY, uid)
    else:
        uid = store.get(_ID_KEY)
    pg = _C.ProcessGroupChorus(bytes(uid), rank, world_size, timeout.total_seconds())
    if rank == 0:
        # Every rank read the id before joining, and joining is collective: the key can go, so a
        # later group that reuses this store's prefix never reads a stale id.
        store.delete_key(_ID_KEY)
    return pg


if "CHORUS" not in dist.Backend._plugins:
    dist.Backend.register_backend("chorus", create_process_group)
