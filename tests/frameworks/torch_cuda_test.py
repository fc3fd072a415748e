#!/usr/bin/env python3
"""CUDA tensors through the "chorus" backend (Chorus's device path), in N processes on the GPUs
there are (ranks share a GPU when there are fewer GPUs than ranks).

    torch_cuda_test.py --world 2

Every collective on the current stream checked exactly, the caller's stream ordered after it,
batch_isend_irecv, and a DDP step on CUDA equal to the same step on CPU with gloo's reference.
Exits 77 (CTest's skip) saying why where torch sees no CUDA device.
"""
import argparse
import copy
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def worker(rank, world, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import chorus_torch  # noqa: F401
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("chorus", rank=rank, world_size=world, device_id=dev)
        n = 1 << 20
        t = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        t.mul_(2)  # on the same stream, after the all_reduce
        check(torch.equal(t.cpu(), torch.full((n,), 2.0 * world * (world + 1) / 2)), "all_reduce")
        out = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev))
        check(torch.equal(out.cpu(), torch.arange(world).float().repeat_interleave(n)), "all_gather_into_tensor")
        rs = torch.empty(n // world, device=dev)
        dist.reduce_scatter_tensor(rs, torch.ones(n, device=dev))
        check(torch.equal(rs.cpu(), torch.full((n // world,), float(world))), "reduce_scatter_tensor")
        b = torch.full((1000,), float(rank), device=dev, dtype=torch.bfloat16)
        dist.broadcast(b, src=world - 1)
        check(torch.equal(b.cpu(), torch.full((1000,), float(world - 1), dtype=torch.bfloat16)), "broadcast")
        a = torch.arange(world * 4, dtype=torch.float32, device=dev) + 100 * rank
        ao = torch.empty_like(a)
        dist.all_to_all_single(ao, a)
        want = torch.cat([torch.arange(4.0) + 4 * rank + 100 * k for k in range(world)])
        check(torch.equal(ao.cpu(), want), "all_to_all_single")
        w = dist.all_reduce(torch.ones(8, device=dev), op=dist.ReduceOp.AVG, async_op=True)
        w.wait()
        check(torch.equal(w.get_future().wait()[0].cpu(), torch.ones(8)), "async AVG and its future")
        ring_in = torch.empty(1 << 18, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, ring_in, (rank - 1) % world),
                                       dist.P2POp(dist.isend, torch.full((1 << 18,), float(rank), device=dev),
                                                  (rank + 1) % world)])
        for r in reqs:
            r.wait()
        check(torch.equal(ring_in.cpu(), torch.full((1 << 18,), float((rank - 1) % world))), "batch_isend_irecv")
        # DDP on CUDA equals the same training on CPU in one process.
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).double()
        model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(ref).to(dev), device_ids=[dev.index])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(5)
        for _ in range(5):
            x = torch.randn(8 * world, 16, generator=g, dtype=torch.float64)
            mine = x[rank * 8:(rank + 1) * 8].to(dev)
            opt.zero_grad()
            model(mine).square().mean().backward()
            opt.step()
            ropt.zero_grad()
            ref(x).square().mean().backward()
            ropt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            check(torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-10, atol=1e-12), "DDP on CUDA")
        dist.barrier()
        dist.destroy_process_group()
        print(f"rank {rank} on {dev}: CUDA tensors passed", flush=True)
    except Exception:
        traceback.print_exc()
        failures.put(rank)
        os._exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device (torch.cuda.is_available() is False): the CUDA-tensor test "
              "needs a GPU")
        return 77
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a.world, port, failures)) for r in range(a.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        if p.is_alive():
            for q in procs:
                q.kill()
            print("a rank did not finish in 300 s")
            return 1
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
