"""DTensor: a row-wise (vocabulary-) sharded embedding's gradient comes back replicated.

RowwiseParallel on nn.Embedding shards the weight's rows (Shard(0)); after a backward its
.grad is a Replicate() DTensor holding the whole vocabulary x dim gradient on every rank, not
the rank's rows. The numbers are right (stratbench checks them); the memory is the whole
table's on every rank, and the optimizer's step redistributes it back to the rows.

    ~/.cache/stratbench/torch2.13/bin/torchrun --nproc_per_node 2 \\
        examples/torch_strategy/rowwise_embedding_grad.py
prints, with PyTorch 2.13.0:
    weight (Shard(dim=0),) (32, 32)
    grad   (Replicate(),) (64, 32)
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
emb = nn.Embedding(64, 32)
parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
emb(torch.randint(0, 64, (4, 16))).sum().backward()
if dist.get_rank() == 0:
    print("weight", emb.weight.placements, tuple(emb.weight.to_local().shape))
    print("grad  ", emb.weight.grad.placements, tuple(emb.weight.grad.to_local().shape))
dist.destroy_process_group()
