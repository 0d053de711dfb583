"""DTensor: ColwiseParallel with a fused projection's weight placed per part still hands on
one run of columns a rank.

GPT-2's c_attn computes q, k and v in one Linear ([3D, D]). Under tensor parallelism a rank
must hold its heads of each: _StridedShard(0, split_factor=3). DTensor's F.linear propagates
that placement exactly (the output _StridedShard on its last dimension, no collective), but
ColwiseParallel's output step redistributes to its output_layouts, Shard(-1): an all-gather,
after which the rank's local columns are one run of [q; k; v] (q and k's first half on rank 0
of 2), which a module splitting its output into q, k and v takes for its own. Right as a
DTensor, silently wrong as the local tensor that use_local_output hands on. stratbench's GPT-2
plan (strategies/torch/builtin_strategies.py, fused_colwise) hands the strided output on.

    ~/.cache/stratbench/torch2.13/bin/torchrun --nproc_per_node 2 \\
        examples/torch_strategy/strided_colwise_output.py
prints, with PyTorch 2.13.0:
    linear alone:         (_StridedShard(dim=2, sf=3),) local = rank's q, k, v: True
    ColwiseParallel:      local = rank's q, k, v: False; one run of [q; k; v]: True
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard


class StridedColwise(ColwiseParallel):
    """What a user writes first: ColwiseParallel with only the parameters' placement changed."""

    def _partition_linear_fn(self, name, module, device_mesh):
        for n, p in list(module.named_parameters(recurse=False)):
            placed = distribute_tensor(p, device_mesh, [_StridedShard(0, split_factor=3)])
            module.register_parameter(n, nn.Parameter(placed))


dist.init_process_group("gloo")
rank, tp = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (tp,))
torch.manual_seed(0)
D = 8
c_attn = nn.Linear(D, 3 * D)
x = torch.randn(2, 4, D)
full = c_attn(x).detach()
mine = torch.cat([part.chunk(tp, dim=-1)[rank] for part in full.split(D, dim=-1)], dim=-1)
run = full.chunk(tp, dim=-1)[rank]

w = distribute_tensor(c_attn.weight.detach(), mesh, [_StridedShard(0, split_factor=3)])
b = distribute_tensor(c_attn.bias.detach(), mesh, [_StridedShard(0, split_factor=3)])
y = nn.functional.linear(DTensor.from_local(x, mesh, [Replicate()]), w, b)
ok = torch.allclose(y.to_local(), mine, atol=1e-6)

parallelize_module(c_attn, mesh, StridedColwise())
local = c_attn(x).detach()
if rank == 0:
    print("linear alone:        ", y.placements, "local = rank's q, k, v:", ok)
    print("ColwiseParallel:      local = rank's q, k, v:", torch.allclose(local, mine, atol=1e-6),
          end="; ")
    print("one run of [q; k; v]:", torch.allclose(local, run, atol=1e-6))
dist.destroy_process_group()
