"""Training and inference steps for bench/torch/run, each timed with the backend under test.

ddp:  DistributedDataParallel over an MLP of 4 x Linear(1024, 1024) with ReLU (4.2 M parameters,
      16.8 MB of float32 gradients, default 25 MB buckets), 32 rows per rank, SGD.
fsdp: FSDP2 fully_shard per layer and at the root over an MLP of 8 x Linear(1024, 1024) (8.4 M
      parameters): each step all-gathers every layer's parameters and reduce-scatters its gradients;
      8 rows per rank, SGD.
tp:   a 2-way tensor-parallel decode step, as in Megatron-style inference: batch 1, hidden 4096,
      8 layers of a column-parallel Linear(4096, 1024) then a row-parallel Linear(1024, 4096) per
      rank, one all_reduce of the 16 KiB activation per layer (latency-bound collectives).

Each rank runs one intra-op thread. The time is the mean over the timed steps after warm-up steps,
of the slowest rank; the checksum of the final parameters (or output) lets bench/torch/run check
that both backends computed the same thing.
"""
import os
import statistics
import time

WORKLOADS = ["ddp", "fsdp", "tp"]
WORLDS = {"ddp": (2, 4), "fsdp": (2, 4), "tp": (2,)}
TITLES = {"ddp": "DDP step (MLP 4.2 M params, batch 32/rank)",
          "fsdp": "FSDP2 step (MLP 8.4 M params, batch 8/rank)",
          "tp": "TP decode step (batch 1, hidden 4096, 8 layers)"}


def _mlp(torch, layers, width):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def _sgd_step(torch, model, rows, g):
    """One training step: `rows` random rows of 1024, loss mean(out^2), SGD at lr 0.01."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        x = torch.randn(rows, 1024, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return step


def worker(rank, world, backend, port, workload, quick, results):
    import torch
    import torch.distributed as dist
    if backend == "chorus":
        import chorus_torch  # noqa: F401
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    warm, timed = (2, 3) if quick else (3, 15)
    if workload == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(_mlp(torch, 4, 1024))
        step = _sgd_step(torch, model, 32, g)

        def checksum():
            return sum(p.detach().double().sum().item() for p in model.parameters())
    elif workload == "fsdp":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        model = _mlp(torch, 8, 1024)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        step = _sgd_step(torch, model, 8, g)

        def checksum():
            return sum(p.full_tensor().double().sum().item() for p in model.parameters())
    else:
        hidden, shard, layers = 4096, 1024 // world * 2, 8
        torch.manual_seed(0)
        cols = [torch.nn.Linear(hidden, shard) for _ in range(layers)]
        rows = [torch.nn.Linear(shard, hidden, bias=False) for _ in range(layers)]
        for m in cols + rows:
            m.requires_grad_(False)
        state = {"x": torch.full((1, hidden), 0.01)}

        def step():
            x = state["x"]
            for c, r in zip(cols, rows):
                y = r(torch.relu(c(x)))
                dist.all_reduce(y)
                x = torch.tanh(y)
            state["x"] = x

        def checksum():
            return state["x"].double().sum().item()
    for _ in range(warm):
        step()
    dist.barrier()
    times = []
    for _ in range(timed):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    mean = torch.tensor([statistics.mean(times)], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    check = checksum()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put((mean.item(), check))
