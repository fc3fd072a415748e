#!/usr/bin/env python3
"""bench/torch/ddp_step.py: DistributedDataParallel step time with the "chorus" backend against gloo.

Usage: PYTHONPATH=<build>/python bench/torch/ddp_step.py [--world 2] [--steps 20] [--rounds 3] [--batch 32]

N processes train an MLP (4 x Linear 1024 -> 1024 with ReLU, 4.2 M parameters, 16.8 MB of float32
gradients) under DistributedDataParallel (default 25 MB buckets), --batch rows per rank, SGD. The step
time is the mean over the steps after 3 warm-up steps on rank 0, median over rounds; the rounds
alternate the backends. Both backends train the same model from the same seed; their final
parameters are compared (they must agree within float32 rounding).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, backend, port, steps, batch, out):
    if backend == "chorus":
        import chorus_torch  # noqa: F401
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(steps + 3):
        x = torch.randn(batch, 1024, generator=g)
        start = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - start)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put((statistics.mean(times), checksum))


def run(world, backend, steps, batch):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, backend, port, steps, batch, out)) for r in range(world)]
    for p in procs:
        p.start()
    res = out.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        sys.exit(f"{backend}: a rank failed")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="rows per rank per step")
    a = ap.parse_args()
    times = {"chorus": [], "gloo": []}
    sums = {}
    for _ in range(a.rounds):
        for backend in ("chorus", "gloo"):
            t, checksum = run(a.world, backend, a.steps, a.batch)
            times[backend].append(t)
            sums[backend] = checksum
    c, g = statistics.median(times["chorus"]), statistics.median(times["gloo"])
    print(f"DDP step, {a.world} processes, MLP 4 x 1024x1024 (4.2 M parameters), batch {a.batch} per rank, "
          f"median of {a.rounds} rounds")
    print("| backend | step ms |\n|---|---|")
    print(f"| chorus | {c * 1e3:.1f} |\n| gloo | {g * 1e3:.1f} |")
    print(f"chorus speed-up: {g / c:.2f}x; parameter checksums chorus {sums['chorus']:.6f}, gloo {sums['gloo']:.6f}")
    if abs(sums["chorus"] - sums["gloo"]) > 1e-3 * max(1.0, abs(sums["gloo"])):
        sys.exit("the backends trained different models")


if __name__ == "__main__":
    main()
