"""PyTorch's own ProcessGroupNCCL (backend "nccl") over Chorus's libnccl.so.2, on a GPU.

Run with the shim preloaded (CTest sets LD_PRELOAD): 2 processes share GPU 0, which NVIDIA's NCCL
refuses ("Duplicate GPU detected") and Chorus stages through host memory. Checked against values
computed here: all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast exactly, and
one DDP step against the same step in one process. Exits 77 (CTest's skip) without a usable GPU.
"""

import os
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:  # no torch here (tests/gpu/run.sh runs this wherever python3 is)
    print(f"skipped: {e}")
    sys.exit(77)

WORLD = 2


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def worker(rank, init_file, out_dir):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    dev = torch.device("cuda", 0)
    t = torch.arange(1024, dtype=torch.float32, device=dev) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.arange(1024, dtype=torch.float32) * 3), "all_reduce"
    mine = torch.full((256,), float(rank), device=dev)
    gathered = torch.empty(WORLD * 256, device=dev)
    dist.all_gather_into_tensor(gathered, mine)
    assert torch.equal(gathered.cpu(), torch.cat([torch.full((256,), 0.0), torch.full((256,), 1.0)])), "all_gather"
    full = torch.arange(WORLD * 128, dtype=torch.float32, device=dev)
    part = torch.empty(128, device=dev)
    dist.reduce_scatter_tensor(part, full)
    assert torch.equal(part.cpu(), torch.arange(rank * 128, (rank + 1) * 128, dtype=torch.float32) * 2), "reduce_scatter"
    b = torch.full((64,), float(rank + 7), device=dev)
    dist.broadcast(b, src=1)
    assert torch.equal(b.cpu(), torch.full((64,), 8.0)), "broadcast"

    net = torch.nn.parallel.DistributedDataParallel(model().to(dev), device_ids=[0])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = batch(rank)
    torch.nn.functional.mse_loss(net(x.to(dev)), y.to(dev)).backward()
    opt.step()
    torch.save([p.detach().cpu() for p in net.parameters()], os.path.join(out_dir, f"ddp{rank}.pt"))
    dist.destroy_process_group()


def reference():
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    grads = []
    for rank in range(WORLD):
        net.zero_grad()
        x, y = batch(rank)
        torch.nn.functional.mse_loss(net(x), y).backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    for p, *g in zip(net.parameters(), *grads):
        p.grad = sum(g) / WORLD
    opt.step()
    return [p.detach() for p in net.parameters()]


def main():
    if not torch.cuda.is_available():
        print("skipped: no usable CUDA device")
        return 77
    if "libnccl" not in os.environ.get("LD_PRELOAD", ""):
        print("LD_PRELOAD does not name Chorus's libnccl.so.2", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(os.path.join(d, "init"), d), nprocs=WORLD, join=True)
        want = reference()
        for rank in range(WORLD):
            got = torch.load(os.path.join(d, f"ddp{rank}.pt"))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    print(f"ok: ProcessGroupNCCL over {os.environ['LD_PRELOAD']}: collectives exact, DDP step matches one process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
