#!/usr/bin/env python3
"""The torch.distributed backend "chorus" against values computed here, in N processes.

    torch_backend_test.py --world 4 ops   # every op, checked exactly
    torch_backend_test.py --world 2 ddp   # DistributedDataParallel equals one process

Processes are started with torch.multiprocessing and meet through env:// (a TCPStore that rank 0
hosts); PYTHONPATH must hold <build>/python. Exit status 0 when every rank passed.
"""
import argparse
import os
import socket
import sys
import traceback

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


def values(rank, n, dtype):
    # 1 or 2 per element: sums, products, minima, maxima and averages are exact in every type.
    return (torch.arange(n) + rank).remainder(2).add(1).to(dtype)


def test_ops(rank, world):
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

    if rank == 0:
        dist.send(torch.arange(6.0), dst=world - 1)
    elif rank == world - 1:
        x = torch.empty(6)
        dist.recv(x, src=0)
        check(torch.equal(x, torch.arange(6.0)), "send/recv")
    dist.barrier()

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

    # Sub-groups: even and odd ranks (every rank creates both, as new_group requires).
    evens = dist.new_group([k for k in range(world) if k % 2 == 0], backend="chorus")
    odds = dist.new_group([k for k in range(world) if k % 2 == 1], backend="chorus")
    mine_group = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine_group)
    check(t.item() == sum(k for k in range(world) if k % 2 == rank % 2), "sub-group all_reduce")

    # Refusals name the problem.
    try:
        dist.all_reduce(torch.ones(4, 4).t(), op=dist.ReduceOp.SUM)
        check(False, "a non-contiguous tensor was accepted")
    except RuntimeError as e:
        check("contiguous" in str(e), f"non-contiguous message: {e}")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND)
        check(False, "BAND was accepted")
    except RuntimeError as e:
        check("not supported" in str(e), f"BAND message: {e}")
    # A root whose gather list has a wrong-sized tensor: refused before anything is sent (every rank
    # is told the same way only at the root, so the others skip the call), and the group state of
    # the root's thread must be clean afterwards.
    if rank == 0:
        try:
            dist.gather(torch.ones(3), [torch.empty(2) for _ in range(world)], dst=0)
            check(False, "a wrong-sized gather output was accepted")
        except RuntimeError as e:
            check("size" in str(e), f"gather size message: {e}")
    try:
        dist.all_to_all_single(torch.empty(world * 2), torch.ones(world * 2), [3] * world, [2] * world)
        check(False, "splits that do not add up were accepted")
    except RuntimeError as e:
        check("add up" in str(e), f"split message: {e}")
    t = torch.ones(3)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((3,), float(world))), "all_reduce after refusals")


def make_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)


def batch(step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g, dtype=dtype)
    return x, torch.sin(x[:, :4] * 2)


def train(model, rank, world, steps, dtype):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per = 32 // world
    for step in range(steps):
        x, y = batch(step, dtype)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp(rank, world):
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        ddp = torch.nn.parallel.DistributedDataParallel(make_model(dtype), bucket_cap_mb=0.001)
        got = train(ddp, rank, world, 10, dtype)
        want = train(make_model(dtype), 0, 1, 10, dtype)
        moved = max((a - b).abs().max().item() for a, b in zip(want, make_model(dtype).parameters()))
        check(moved > 1e-3, "the reference model did not train")
        for a, b in zip(got, want):
            err = ((a - b).abs().max() / b.abs().max()).item()
            check(err <= tol, f"DDP {dtype}: relative error {err:.2e} > {tol:.0e}")
        if rank == 0:
            print(f"DDP {dtype} on {world} ranks equals one process (max relative error "
                  f"{max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want)):.2e})")


def worker(rank, world, case, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import chorus_torch  # noqa: F401  registers the backend in this process
        dist.init_process_group("chorus", rank=rank, world_size=world)
        check(dist.get_backend() == "chorus", f"backend is {dist.get_backend()}")
        {"ops": test_ops, "ddp": test_ddp}[case](rank, world)
        # Everyone is done before rank 0, which hosts the store, leaves.
        dist.barrier()
        dist.destroy_process_group()
        print(f"rank {rank}: {case} passed")
    except Exception:
        traceback.print_exc()
        failures.put(rank)
        os._exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("case", choices=["ops", "ddp"])
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a.world, a.case, port, failures)) for r in range(a.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        if p.is_alive():
            print("a rank did not finish in 300 s")
            for q in procs:
                q.kill()
            return 1
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
