"""Chorus as a torch.distributed backend.

    import chorus_torch                     # registers the backend "chorus" (in every process)
    torch.distributed.init_process_group("chorus", ...)

Collectives on CPU tensors run through Chorus (shared memory between the processes of a host,
TCP, UCX or RDMA verbs between hosts). The c10d store only carries each group's Chorus unique id,
made by the group's rank 0: after that, data never goes through the store. See docs/frameworks.md.
"""
from datetime import timedelta

import torch.distributed as dist

from . import _C

__all__ = ["create_process_group", "version"]

_ID_KEY = "chorus/unique_id"


def version():
    """Chorus's version as major*10000 + minor*100 + patch."""
    return _C.version()


def create_process_group(store, rank, world_size, timeout=timedelta(minutes=30)):
    """The backend's creator, as torch.distributed calls it for every group."""
    if rank == 0:
        uid = _C.unique_id()
        store.set(_ID_KEY, uid)
    else:
        uid = store.get(_ID_KEY)
    return _C.ProcessGroupChorus(bytes(uid), rank, world_size, timeout.total_seconds())


if "CHORUS" not in dist.Backend._plugins:
    dist.Backend.register_backend("chorus", create_process_group)
