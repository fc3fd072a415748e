#!/usr/bin/env python3
"""The torch.distributed backend "chorus" against values computed here, in N processes.

    torch_backend_test.py --world 4 ops         # every op, checked exactly
    torch_backend_test.py --world 2 ddp         # DistributedDataParallel equals one process
    torch_backend_test.py --world 4 fsdp        # FSDP2 fully_shard equals one process (fp32) and gloo (bf16)
    torch_backend_test.py --world 4 tp          # DTensor tensor parallelism on a (2, 2) mesh
    torch_backend_test.py --world 2 pipeline    # torch.distributed.pipelining, 2 stages
    torch_backend_test.py --world 2 functional  # torch.distributed._functional_collectives
    torch_backend_test.py --world 2 errors      # bad input and timeouts raise, naming the problem
    torch_backend_test.py --world 2 dead        # a killed rank is named in the survivor's error
    torch_backend_test.py --world 2 entrypoint  # no `import chorus_torch`: the entry point registers it
    torchrun ... torch_backend_test.py --torchrun ddp   # one rank of a job torchrun started (multi-host test)
    torch_backend_test.py --world 4 ops ddp fsdp    # several cases one after another in one job

Processes are started with torch.multiprocessing and meet through env:// (a TCPStore that rank 0
hosts). Several cases share one process group, which saves each case's start (every process imports
torch: about 3 CPU-seconds); errors, dead and entrypoint change the job's settings and run alone.
PYTHONPATH must hold <build>/python (or, for `entrypoint`, a pip-installed package).
Exit status 0 when every rank passed.
"""
import argparse
import os
import socket
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_error(fn, *needles):
    """fn() must raise a RuntimeError whose message holds every needle; returns the message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for n in needles:
            check(n in msg, f"expected {n!r} in the error: {msg}")
        return msg
    raise AssertionError(f"no error raised; expected one with {needles}")


def values(rank, n, dtype):
    # 1 or 2 per element: sums, products, minima, maxima and averages are exact in every type.
    return (torch.arange(n) + rank).remainder(2).add(1).to(dtype)


# ---- ops -----------------------------------------------------------------------------------------

def test_reductions(rank, world):
    n = 1031
    types = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
             torch.int8, torch.uint8]
    everyone = [values(r, n, torch.float64) for r in range(world)]
    expect = {
        dist.ReduceOp.SUM: sum(everyone),
        dist.ReduceOp.PRODUCT: torch.stack(everyone).prod(0),
        dist.ReduceOp.MIN: torch.stack(everyone).min(0).values,
        dist.ReduceOp.MAX: torch.stack(everyone).max(0).values,
    }
    for dtype in types:
        for op, want in expect.items():
            t = values(rank, n, dtype)
            dist.all_reduce(t, op=op)
            check(torch.equal(t.to(torch.float64), want), f"all_reduce {dtype} {op}")
        if dtype.is_floating_point:
            t = values(rank, n, dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check(torch.equal(t.to(torch.float64), expect[dist.ReduceOp.SUM] / world), f"all_reduce {dtype} AVG")
    # Bitwise ops on integers (gathered and folded), on bool (min and max).
    mine = torch.tensor([1 << rank, 3, rank, -1], dtype=torch.int64)
    every = [torch.tensor([1 << r, 3, r, -1], dtype=torch.int64) for r in range(world)]
    for op, fold in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                     (dist.ReduceOp.BXOR, torch.bitwise_xor)):
        want = every[0]
        for e in every[1:]:
            want = fold(want, e)
        for dtype in (torch.int64, torch.int32, torch.uint8):
            t = mine.to(dtype).clone()
            dist.all_reduce(t, op=op)
            check(torch.equal(t, want.to(dtype)), f"all_reduce {dtype} {op}")
        r = mine.clone()
        dist.reduce(r, dst=world - 1, op=op)
        if rank == world - 1:
            check(torch.equal(r, want), f"reduce {op}")
        out = torch.empty(2, dtype=torch.int64)
        dist.reduce_scatter_tensor(out, torch.cat([mine[:2] + k for k in range(world)]), op=op)
        w2 = every[0][:2] + rank
        for e in every[1:]:
            w2 = fold(w2, e[:2] + rank)
        check(torch.equal(out, w2), f"reduce_scatter_tensor {op}")
    b = torch.tensor([rank == 0, True, False, rank % 2 == 1])
    for op, want in ((dist.ReduceOp.SUM, [True, True, False, world > 1]),
                     (dist.ReduceOp.MAX, [True, True, False, world > 1]),
                     (dist.ReduceOp.BOR, [True, True, False, world > 1]),
                     (dist.ReduceOp.PRODUCT, [world == 1, True, False, False]),
                     (dist.ReduceOp.BAND, [world == 1, True, False, False]),
                     (dist.ReduceOp.MIN, [world == 1, True, False, False])):
        t = b.clone()
        dist.all_reduce(t, op=op)
        check(t.tolist() == want, f"all_reduce bool {op}: {t.tolist()}")
    # PREMUL_SUM, as FSDP uses it: sum of factor * x, scalar and tensor factors.
    x = torch.full((9,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    check(torch.equal(x, torch.full((9,), 0.5 * sum(range(1, world + 1)), dtype=torch.float64)), "PREMUL_SUM")
    x = torch.full((9,), float(rank + 1))
    src = torch.cat([x * (k + 1) for k in range(world)])
    keep = src.clone()
    out = torch.empty(9)
    dist.reduce_scatter_tensor(out, src, op=dist._make_nccl_premul_sum(torch.tensor([0.25])))
    check(torch.equal(out, torch.full((9,), 0.25 * (rank + 1) * sum(range(1, world + 1)))), "PREMUL_SUM reduce_scatter")
    check(torch.equal(src, keep), "PREMUL_SUM changed reduce_scatter_tensor's input")
    # Complex numbers reduce as pairs of reals.
    z = torch.tensor([complex(rank, 1), complex(1, -rank)], dtype=torch.complex64)
    dist.all_reduce(z)
    s = sum(range(world))
    check(torch.equal(z, torch.tensor([complex(s, world), complex(world, -s)], dtype=torch.complex64)), "complex")
    # Types without a reduction still move.
    h = torch.arange(6, dtype=torch.int16) + rank
    dist.broadcast(h, src=0)
    check(torch.equal(h, torch.arange(6, dtype=torch.int16)), "broadcast int16")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "int16", "not supported")
    expect_error(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "BAND", "not supported")
    # A sparse COO tensor sums as gloo's does: rank r holds 1s at rows r and r + 1 of a 2-D tensor.
    dense = torch.zeros(world + 1, 3)
    dense[rank] = 1.0
    dense[rank + 1] = rank + 1.0
    sp = dense.to_sparse()
    dist.all_reduce(sp)
    want = torch.zeros(world + 1, 3)
    for r in range(world):
        want[r] += 1.0
        want[r + 1] += r + 1.0
    check(sp.is_sparse and torch.equal(sp.to_dense(), want), f"sparse all_reduce: {sp.to_dense()}")
    # Non-contiguous tensors are copied in and out.
    nc = torch.arange(16, dtype=torch.float32).reshape(4, 4).t()
    dist.all_reduce(nc)
    check(torch.equal(nc, torch.arange(16, dtype=torch.float32).reshape(4, 4).t() * world), "non-contiguous")
    nco = torch.empty(4, 2 * world).t()  # the output of an all-gather, strided
    dist.all_gather_into_tensor(nco, torch.full((2, 4), float(rank)))
    check(all(torch.equal(nco[2 * r:2 * r + 2], torch.full((2, 4), float(r))) for r in range(world)),
          "all_gather_into_tensor into a non-contiguous output")


def test_collectives(rank, world):
    # Asynchronous handle and its future (what DDP uses).
    t = torch.full((10,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    fut = work.get_future()
    check(torch.equal(fut.value()[0], torch.full((10,), float(sum(range(world))))), "all_reduce future")

    mine = torch.arange(7, dtype=torch.float32) + 100 * rank
    out = [torch.empty(7) for _ in range(world)]
    dist.all_gather(out, mine)
    check(all(torch.equal(out[r], torch.arange(7.0) + 100 * r) for r in range(world)), "all_gather")
    flat = torch.empty(7 * world)
    dist.all_gather_into_tensor(flat, mine)
    check(torch.equal(flat, torch.cat(out)), "all_gather_into_tensor")
    # all_gather_coalesced: several tensors of several sizes per rank.
    ins = [torch.full((3,), float(rank)), torch.arange(2.0) + rank]
    outs = [[torch.empty(3), torch.empty(2)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    check(all(torch.equal(outs[r][0], torch.full((3,), float(r))) and torch.equal(outs[r][1], torch.arange(2.0) + r)
              for r in range(world)), "all_gather_coalesced")
    # Coalesced forms through the coalescing manager (as FSDP issues them).
    from torch.distributed.distributed_c10d import _coalescing_manager
    a_out = [torch.empty(4 * world), torch.empty(2 * world)]
    with _coalescing_manager(async_ops=True, device=torch.device("cpu")) as cm:
        dist.all_gather_into_tensor(a_out[0], torch.full((4,), float(rank)))
        dist.all_gather_into_tensor(a_out[1], torch.full((2,), float(rank + 10)))
    cm.wait()
    check(torch.equal(a_out[0], torch.arange(world).float().repeat_interleave(4)), "coalesced all_gather 0")
    check(torch.equal(a_out[1], (torch.arange(world).float() + 10).repeat_interleave(2)), "coalesced all_gather 1")
    r_out = [torch.empty(3), torch.empty(5)]
    with _coalescing_manager(async_ops=True, device=torch.device("cpu")) as cm:
        dist.reduce_scatter_tensor(r_out[0], torch.ones(3 * world))
        dist.reduce_scatter_tensor(r_out[1], torch.arange(5 * world, dtype=torch.float32))
    cm.wait()
    check(torch.equal(r_out[0], torch.full((3,), float(world))), "coalesced reduce_scatter 0")
    check(torch.equal(r_out[1], (torch.arange(5) + 5 * rank).float() * world), "coalesced reduce_scatter 1")
    ar = [torch.ones(3), torch.full((2,), 2.0)]
    with _coalescing_manager(async_ops=False, device=torch.device("cpu")):
        for x in ar:
            dist.all_reduce(x)
    check(torch.equal(ar[0], torch.full((3,), float(world))) and torch.equal(ar[1], torch.full((2,), 2.0 * world)),
          "coalesced all_reduce")

    ins = [torch.full((5,), float(rank * 10 + r)) for r in range(world)]
    res = torch.empty(5)
    dist.reduce_scatter(res, ins)
    check(torch.equal(res, torch.full((5,), float(sum(r * 10 + rank for r in range(world))))), "reduce_scatter")
    res2 = torch.empty(5)
    dist.reduce_scatter_tensor(res2, torch.cat(ins), op=dist.ReduceOp.MAX)
    check(torch.equal(res2, torch.full((5,), float((world - 1) * 10 + rank))), "reduce_scatter_tensor")

    b = torch.arange(9, dtype=torch.int64) * (rank + 1)
    dist.broadcast(b, src=world - 1)
    check(torch.equal(b, torch.arange(9) * world), "broadcast")
    r = torch.full((4,), rank + 1.0, dtype=torch.float64)
    dist.reduce(r, dst=1, op=dist.ReduceOp.PRODUCT)
    if rank == 1:
        want = 1.0
        for k in range(world):
            want *= k + 1
        check(torch.equal(r, torch.full((4,), want, dtype=torch.float64)), "reduce")

    # all_to_all with uneven sizes: rank r sends r + k + 1 elements to rank k.
    send = [torch.full((rank + k + 1,), float(rank * 100 + k)) for k in range(world)]
    recv = [torch.empty(k + rank + 1) for k in range(world)]
    dist.all_to_all(recv, send)
    check(all(torch.equal(recv[k], torch.full((k + rank + 1,), float(k * 100 + rank))) for k in range(world)),
          "all_to_all")
    single_in = torch.arange(world * 3, dtype=torch.float32) + 1000 * rank
    single_out = torch.empty(world * 3)
    dist.all_to_all_single(single_out, single_in)
    check(torch.equal(single_out, torch.cat([torch.arange(3.0) + 3 * rank + 1000 * k for k in range(world)])),
          "all_to_all_single")
    in_splits = [k + 1 for k in range(world)]        # rank r sends k + 1 rows to rank k
    out_splits = [rank + 1] * world                  # and receives rank + 1 rows from each
    uin = torch.cat([torch.full((k + 1, 2), float(rank * 10 + k)) for k in range(world)])
    uout = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(uout, uin, out_splits, in_splits)
    check(torch.equal(uout, torch.cat([torch.full((rank + 1, 2), float(k * 10 + rank)) for k in range(world)])),
          "all_to_all_single uneven")

    g = torch.full((3,), float(rank))
    gl = [torch.empty(3) for _ in range(world)] if rank == 0 else None
    dist.gather(g, gl, dst=0)
    if rank == 0:
        check(all(torch.equal(gl[k], torch.full((3,), float(k))) for k in range(world)), "gather")
    s = torch.empty(2)
    dist.scatter(s, [torch.full((2,), float(k * 7)) for k in range(world)] if rank == 1 else None, src=1)
    check(torch.equal(s, torch.full((2,), float(rank * 7))), "scatter")
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    check(objs == [{"rank": k} for k in range(world)], "all_gather_object")

    # Sequence numbers count this group's operations; the profiler sees "chorus:<op>".
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    check(pg._get_sequence_number_for_group() == before + 1, "sequence number")
    with torch.autograd.profiler.profile() as prof:
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(4), src=0)
    names = {e.name for e in prof.function_events}
    check({"chorus:all_reduce", "chorus:broadcast"} <= names, f"profiler events: {sorted(names)[:20]}")
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)


def test_p2p(rank, world):
    if rank == 0:
        dist.send(torch.arange(6.0), dst=world - 1)
    elif rank == world - 1:
        x = torch.empty(6)
        dist.recv(x, src=0)
        check(torch.equal(x, torch.arange(6.0)), "send/recv")
    dist.barrier()
    # Tags are matched: rank 0 sends tags 1, 2, 3; the last rank receives 2, 3, 1.
    last = world - 1
    if rank == 0:
        reqs = [dist.isend(torch.full((4,), 1.0), last, tag=1), dist.isend(torch.full((4,), 2.0), last, tag=2),
                dist.isend(torch.full((4,), 3.0), last, tag=3)]
        for q in reqs:
            q.wait()
    elif rank == last:
        r2, r3, r1 = torch.empty(4), torch.empty(4), torch.empty(4)
        reqs = [dist.irecv(r2, 0, tag=2), dist.irecv(r3, 0, tag=3), dist.irecv(r1, 0, tag=1)]
        for q in reqs:
            q.wait()
        check(torch.equal(r1, torch.full((4,), 1.0)) and torch.equal(r2, torch.full((4,), 2.0))
              and torch.equal(r3, torch.full((4,), 3.0)), f"tags: {r1} {r2} {r3}")
        check(reqs[0]._source_rank() == 0, f"irecv's _source_rank() is {reqs[0]._source_rank()}")
    # A message sent before its receive is posted, with another tag received in between.
    if rank == 0:
        dist.send(torch.full((3,), 5.0), last, tag=5)
        dist.send(torch.full((3,), 6.0), last, tag=6)
    elif rank == last:
        a, b = torch.empty(3), torch.empty(3)
        dist.recv(b, 0, tag=6)
        dist.recv(a, 0, tag=5)
        check(torch.equal(a, torch.full((3,), 5.0)) and torch.equal(b, torch.full((3,), 6.0)), "unexpected message")
    dist.barrier()
    expect_error(lambda: dist.recv(torch.empty(1)), "any source")

    # Both sides receive first, 4 MiB each way (more than the transports buffer): queued
    # sends and receives run together when waited for, so this does not wait for the timeout.
    if world % 2 == 0:
        peer = rank ^ 1
        big_out = torch.full((1 << 20,), float(rank))
        big_in = torch.empty(1 << 20)
        r_req = dist.irecv(big_in, src=peer)
        s_req = dist.isend(big_out, dst=peer)
        r_req.wait()
        s_req.wait()
        check(torch.equal(big_in, torch.full((1 << 20,), float(peer))), "irecv then isend")
    # A ring through batch_isend_irecv, receive listed first.
    ring_in = torch.empty(1 << 19)
    ops = [dist.P2POp(dist.irecv, ring_in, (rank - 1) % world),
           dist.P2POp(dist.isend, torch.full((1 << 19,), float(rank)), (rank + 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    check(torch.equal(ring_in, torch.full((1 << 19,), float((rank - 1) % world))), "batch_isend_irecv ring")
    # Non-contiguous send and receive.
    nc_in = torch.empty(3, 4).t()
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.arange(12.0).reshape(3, 4).t(), (rank + 1) % world),
                                       dist.P2POp(dist.irecv, nc_in, (rank - 1) % world)]):
        req.wait()
    check(torch.equal(nc_in, torch.arange(12.0).reshape(3, 4).t()), "non-contiguous send/recv")


def test_groups(rank, world):
    # Sub-groups: even and odd ranks (every rank creates both, as new_group requires).
    evens = dist.new_group([k for k in range(world) if k % 2 == 0], backend="chorus")
    odds = dist.new_group([k for k in range(world) if k % 2 == 1], backend="chorus")
    mine_group = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine_group)
    check(t.item() == sum(k for k in range(world) if k % 2 == rank % 2), "sub-group all_reduce")
    # split_group (what DeviceMesh uses): the backend splits its communicator's store.
    halves = [list(range(0, world // 2 or 1)), list(range(world // 2 or 1, world))]
    halves = [h for h in halves if h]
    sg = dist.split_group(split_ranks=halves)
    mine = next(h for h in halves if rank in h)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=sg)
    check(t.item() == sum(mine), f"split_group all_reduce: {t.item()} != {sum(mine)}")
    check(dist.get_world_size(sg) == len(mine), "split_group size")
    # Mixed backends: chorus for CPU, as "cpu:chorus,cuda:nccl" makes.
    mixed = dist.new_group(list(range(world)), backend="cpu:chorus,cuda:gloo")
    t = torch.ones(2)
    dist.all_reduce(t, group=mixed)
    check(torch.equal(t, torch.full((2,), float(world))), "cpu:chorus group")
    check(mixed._get_backend(torch.device("cpu")).name() == "chorus", "cpu:chorus backend name")
    gc = dist.new_group(list(range(world)), backend="cpu:gloo,cuda:chorus")
    check(gc._get_backend(torch.device("cpu")).name() == "gloo", "cpu:gloo backend name")


def test_ops(rank, world):
    test_reductions(rank, world)
    test_collectives(rank, world)
    test_p2p(rank, world)
    test_groups(rank, world)
    t = torch.ones(3)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((3,), float(world))), "all_reduce at the end")


# ---- errors --------------------------------------------------------------------------------------

def test_errors(rank, world):
    expect_error(lambda: dist.all_reduce(torch.ones(3).to_sparse(), op=dist.ReduceOp.MAX), "sparse", "SUM only")
    # torch's dispatcher refuses sparse tensors for the other ops before a backend sees them; called
    # on the backend object directly, chorus refuses them itself.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    expect_error(lambda: backend.broadcast([torch.ones(3).to_sparse()], dist.BroadcastOptions()), "sparse",
                 "no data was read")
    expect_error(lambda: dist.all_to_all_single(torch.empty(world * 2), torch.ones(world * 2), [3] * world,
                                                [2] * world), "add up")
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)), "world_size")
    if rank == 0:
        expect_error(lambda: dist.gather(torch.ones(3), [torch.empty(2) for _ in range(world)], dst=0), "size")
    t = torch.ones(3)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((3,), float(world))), "all_reduce after refusals")
    # A size mismatch across ranks: Chorus's call check (CHORUS_CHECK=1, set by this case) names it.
    # It breaks the group it happens in (as a timeout does), so both happen in groups of their own.
    g1 = dist.new_group(list(range(world)))
    msg = expect_error(lambda: dist.all_reduce(torch.ones(4 + rank), group=g1), "count")
    check("rank" in msg, f"the mismatch message names no rank: {msg}")
    # A collective that one rank skips times out, saying so, within the group's timeout.
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=2))
    if rank == 0:
        import time
        start = time.monotonic()
        msg = expect_error(lambda: dist.all_reduce(torch.ones(2), group=g), "Timed out")
        check(time.monotonic() - start < 30, "the timeout took too long")
    # The same through setTimeout (torch's _set_pg_timeout) on a group made with the default timeout.
    g2 = dist.new_group(list(range(world)))
    dist.all_reduce(torch.ones(1), group=g2)
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=2), g2)
    if rank == 0:
        expect_error(lambda: dist.all_reduce(torch.ones(2), group=g2), "Timed out")
    # An aborted group refuses later calls at once.
    g3 = dist.new_group(list(range(world)))
    g3.abort()
    expect_error(lambda: dist.all_reduce(torch.ones(1), group=g3), "aborted")
    dist.barrier(group=dist.new_group(list(range(world)), backend="gloo"))


def test_dead(rank, world):
    """The last rank dies after init; the others' next collective names it (no hang); the
    survivors shrink the group (shrink_group, chorusCommShrink) and go on without it."""
    if rank == world - 1:
        os._exit(17)
    msg = expect_error(lambda: dist.all_reduce(torch.ones(1 << 16)), "chorus")
    check(f"rank {world - 1}" in msg or f"ranks {world - 1}" in msg, f"the dead rank is not named: {msg}")
    if rank == 0:
        print(f"rank 0 saw: {msg.splitlines()[0][:300]}")
    if world > 2:
        dist.shrink_group([world - 1])
        check(dist.get_world_size() == world - 1, f"the shrunk group has {dist.get_world_size()} ranks")
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        check(torch.equal(t, torch.full((4,), float(sum(range(1, world))))), "all_reduce after shrink_group")
        if rank == 0:
            print(f"shrink_group: {world - 1} survivors all_reduce again")


# ---- DDP ----------------------------------------------------------------------------------------

def make_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)


def batch(step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g, dtype=dtype)
    return x, torch.sin(x[:, :4] * 2)


def train(model, rank, world, steps, dtype, accumulate=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per = 32 // world
    for step in range(steps):
        x, y = batch(step, dtype)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        chunks = list(zip(x.chunk(accumulate), y.chunk(accumulate)))
        for i, (xc, yc) in enumerate(chunks):
            loss = torch.nn.functional.mse_loss(model(xc), yc) / accumulate
            if accumulate > 1 and i < len(chunks) - 1 and hasattr(model, "no_sync"):
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def rel_err(got, want):
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))


class WithUnused(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.body = make_model(dtype)
        self.unused = torch.nn.Linear(4, 4).to(dtype)

    def forward(self, x):
        return self.body(x)


def test_ddp(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    DDP = torch.nn.parallel.DistributedDataParallel
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        want = train(make_model(dtype), 0, 1, 10, dtype)
        moved = max((a - b).abs().max().item() for a, b in zip(want, make_model(dtype).parameters()))
        check(moved > 1e-3, "the reference model did not train")
        got = train(DDP(make_model(dtype), bucket_cap_mb=0.001), rank, world, 10, dtype)
        err = rel_err(got, want)
        check(err <= tol, f"DDP {dtype}: relative error {err:.2e} > {tol:.0e}")
        # Gradient accumulation with no_sync: 2 micro-batches per step, the first without a reduction.
        acc = train(DDP(make_model(dtype)), rank, world, 10, dtype, accumulate=2)
        check(rel_err(acc, want) <= tol, f"DDP no_sync {dtype}: {rel_err(acc, want):.2e}")
        # find_unused_parameters with a parameter no step uses.
        m = DDP(WithUnused(dtype), find_unused_parameters=True)
        unused = train(m, rank, world, 10, dtype)[:len(want)]
        check(rel_err(unused, want) <= tol, f"DDP find_unused_parameters {dtype}: {rel_err(unused, want):.2e}")
        if rank == 0:
            print(f"DDP {dtype} on {world} ranks equals one process (max relative error {err:.2e})")
    # A communication hook: gradients compressed to bfloat16 (the future chains on chorus's Work).
    m = DDP(make_model(torch.float32))
    m.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    got = train(m, rank, world, 10, torch.float32)
    want = train(make_model(torch.float32), 0, 1, 10, torch.float32)
    check(rel_err(got, want) <= 2e-2, f"DDP bf16_compress_hook: {rel_err(got, want):.2e}")
    if rank == 0:
        print(f"DDP with bf16_compress_hook: relative error {rel_err(got, want):.2e} (bf16 gradients)")


# ---- FSDP2 ---------------------------------------------------------------------------------------

def test_fsdp(rank, world):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                   torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def run(mesh, mp_policy, steps=6):
        model = build()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        per = 32 // world
        for step in range(steps):
            x, y = batch(step, torch.float32)
            x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    chorus_mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    got = run(chorus_mesh, MixedPrecisionPolicy())
    ref = build()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(6):
        x, y = batch(step, torch.float32)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    want = [p.detach() for p in ref.parameters()]
    err = rel_err(got, want)
    check(err <= 1e-5, f"FSDP2 fp32: relative error {err:.2e}")
    # bf16 parameters, fp32 reduction: against gloo running the same.
    gloo = dist.new_group(list(range(world)), backend="gloo")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    got_bf16 = run(chorus_mesh, policy)
    want_bf16 = run(DeviceMesh.from_group(gloo, "cpu"), policy)
    err16 = rel_err(got_bf16, want_bf16)
    check(err16 <= 1e-5, f"FSDP2 bf16/fp32 against gloo: relative error {err16:.2e}")
    check(rel_err(got_bf16, want) <= 5e-2, f"FSDP2 bf16 against one process: {rel_err(got_bf16, want):.2e}")
    if rank == 0:
        print(f"FSDP2 on {world} ranks: fp32 equals one process ({err:.2e}); bf16 params with fp32 reduction "
              f"equal gloo ({err16:.2e})")


# ---- Tensor parallelism (DTensor) -----------------------------------------------------------------

def test_tp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = torch.nn.Linear(16, 32, dtype=torch.float64)
            self.fc2 = torch.nn.Linear(32, 16, dtype=torch.float64)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    dp = 2 if world % 2 == 0 and world >= 4 else 1
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(MLP(), mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    ref = MLP()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 16, generator=g, dtype=torch.float64)
    dp_rank = mesh.get_local_rank("dp")
    xs = x.chunk(dp)[dp_rank]
    out = model(xs)
    check(torch.allclose(out, ref(x).chunk(dp)[dp_rank], rtol=1e-12, atol=1e-12), "TP forward")
    out.sum().backward()
    ref(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if dp > 1:
            dist.all_reduce(grad, group=mesh["dp"].get_group())
        check(torch.allclose(grad, q.grad, rtol=1e-10, atol=1e-12), f"TP gradient of {name}")
    check(mesh["tp"].get_group()._get_backend(torch.device("cpu")).name() == "chorus", "the mesh's backend")
    if rank == 0:
        print(f"DTensor TP on a ({dp}, {world // dp}) mesh equals the unsharded module")


# ---- Pipeline parallelism -------------------------------------------------------------------------

def test_pipeline(rank, world):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8, dtype=torch.float64) for _ in range(2 * world)]
    per = 2
    stage_mod = torch.nn.Sequential(*layers[rank * per:(rank + 1) * per])
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    loss_fn = lambda out, target: torch.nn.functional.mse_loss(out, target)  # noqa: E731
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 8, generator=g, dtype=torch.float64)
    y = torch.randn(16, 8, generator=g, dtype=torch.float64)
    losses = []
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    torch.manual_seed(0)
    ref_layers = [torch.nn.Linear(8, 8, dtype=torch.float64) for _ in range(2 * world)]
    full = torch.nn.Sequential(*ref_layers)
    ref_loss = sum(loss_fn(full(xc), yc) for xc, yc in zip(x.chunk(4), y.chunk(4)))
    (ref_loss / 4).backward()  # the schedule scales gradients by 1 / n_microbatches
    for p, q in zip(stage_mod.parameters(), [p for l in ref_layers[rank * per:(rank + 1) * per] for p in l.parameters()]):
        check(torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-12), "pipeline gradient")
    if rank == world - 1:
        check(abs(sum(l.item() for l in losses) - ref_loss.item()) < 1e-10, "pipeline loss")
        print(f"pipelining: GPipe over {world} stages equals one process (loss {ref_loss.item():.6f})")


# ---- Functional collectives ----------------------------------------------------------------------

def test_functional(rank, world):
    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    wait = funcol.wait_tensor
    t = torch.full((4,), float(rank + 1))
    s = wait(funcol.all_reduce(t, "sum", group))
    check(torch.equal(s, torch.full((4,), float(sum(range(1, world + 1))))), "funcol all_reduce")
    ag = wait(funcol.all_gather_tensor(torch.full((2, 3), float(rank)), 0, group))
    check(torch.equal(ag, torch.arange(world).float().repeat_interleave(2).unsqueeze(1).expand(-1, 3)),
          "funcol all_gather_tensor")
    rs = wait(funcol.reduce_scatter_tensor(torch.arange(2 * world, dtype=torch.float32), "sum", 0, group))
    check(torch.equal(rs, torch.arange(2 * rank, 2 * rank + 2).float() * world), "funcol reduce_scatter_tensor")
    a2a = wait(funcol.all_to_all_single(torch.arange(world, dtype=torch.float32) + 10 * rank, None, None, group))
    check(torch.equal(a2a, torch.arange(world).float() * 10 + rank), "funcol all_to_all_single")
    coal = [wait(x) for x in funcol.all_reduce_coalesced([torch.ones(2), torch.full((3,), 2.0)], "sum", group)]
    check(torch.equal(coal[1], torch.full((3,), 2.0 * world)), "funcol all_reduce_coalesced")
    b = wait(funcol.broadcast(torch.full((3,), float(rank)), 0, group))
    check(torch.equal(b, torch.zeros(3)), "funcol broadcast")

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(x):
        return wait(funcol.all_reduce(x * 2, "sum", group)) + 1

    out = compiled(torch.full((4,), float(rank)))
    check(torch.equal(out, torch.full((4,), 2.0 * sum(range(world)) + 1)), "funcol under torch.compile")


CASES = {"ops": test_ops, "ddp": test_ddp, "fsdp": test_fsdp, "tp": test_tp, "pipeline": test_pipeline,
         "functional": test_functional, "errors": test_errors, "dead": test_dead, "entrypoint": test_collectives}


# Cases that set up the job their own way (environment, backend registration, a rank killed): alone.
ALONE = ("errors", "dead", "entrypoint")


def run_cases(cases, rank, world, where):
    for i, case in enumerate(cases):
        if i:
            dist.barrier()  # the previous case is over on every rank
        CASES[case](rank, world)
        print(f"rank {rank}{where}: {case} passed", flush=True)


def worker(rank, world, cases, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cases == ["errors"]:
        os.environ["CHORUS_CHECK"] = "1"
    if cases == ["dead"]:
        os.environ["CHORUS_TIMEOUT"] = "20"
    try:
        if cases == ["entrypoint"]:
            check("chorus_torch" not in sys.modules, "chorus_torch was imported before init")
        else:
            import chorus_torch  # noqa: F401  registers the backend in this process
        dist.init_process_group("chorus", rank=rank, world_size=world, timeout=timedelta(seconds=120))
        check(dist.get_backend() == "chorus", f"backend is {dist.get_backend()}")
        run_cases(cases, rank, world, "")
        if cases == ["dead"]:
            os._exit(0)  # the dead rank's communicator cannot be finished politely
        # Everyone is done before rank 0, which hosts the store, leaves.
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        failures.put(rank)
        os._exit(1)


def under_torchrun(cases):
    """One rank started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import chorus_torch  # noqa: F401
    dist.init_process_group("chorus", timeout=timedelta(seconds=120))
    check(dist.get_backend() == "chorus", f"backend is {dist.get_backend()}")
    run_cases(cases, rank, world, f" of {world} (host {os.environ.get('GROUP_RANK', '?')})")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--torchrun", action="store_true", help="this process is one rank that torchrun started")
    ap.add_argument("cases", nargs="+", choices=sorted(CASES), metavar="case",
                    help="one or more of: " + ", ".join(sorted(CASES)))
    a = ap.parse_args()
    if len(a.cases) > 1 and any(c in ALONE for c in a.cases):
        ap.error(f"{', '.join(ALONE)} run alone")
    if a.torchrun:
        return under_torchrun(a.cases)
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a.world, a.cases, port, failures)) for r in range(a.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=800)
        if p.is_alive():
            print("a rank did not finish in 800 s")
            for q in procs:
                q.kill()
            return 1
    codes = [p.exitcode for p in procs]
    if a.cases == ["dead"]:
        ok = codes[-1] == 17 and all(c == 0 for c in codes[:-1])
    else:
        ok = all(c == 0 for c in codes)
    if not ok:
        print(f"exit codes: {codes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
