"""A user's own PyTorch strategy, run by stratbench as the executor `torch/file`.

FSDP2 with every block's activations checkpointed, as torchtitan configures a large model:
each block wrapped in checkpoint_wrapper (its activations recomputed in the backward), then
fully_shard'ed as its own unit, then the root. stratbench hands this function the model (built
from the Python source the case's TorchScript file was traced from, its parameters set to the
reference's) and a DeviceMesh of the case's shape, runs the case's optimizer steps, and checks
every rank's shards of every parameter and optimizer state, the loss and the gradient norm of
each step against LibTorch's single-process reference (docs/torch-strategies.md).

    params: {strategy_file: examples/torch_strategy/fsdp_checkpointed.py}
    strategies: ["torch/file"]

What a strategy file may define (only parallelize is required):
  parallelize(model, mesh, ctx) -> model   ctx: mesh, case (the case as JSON), params (the
                                           case's params), dtype, fault, world_size, rank
  MESH_DIM_NAMES                           the mesh's axis names (default dim0, dim1, ...)
  BATCH_AXES                               the axes the batch is split over (default: none,
                                           every rank runs the whole batch)
  GRADIENT_MEAN                            whether the strategy averages gradients over the
                                           batch axes (DDP, FSDP do: the default)
  applies(ctx) -> None | str               why a case cannot run (its row `unsupported`)
"""

import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import fully_shard

MESH_DIM_NAMES = ("dp",)
BATCH_AXES = ("dp",)


def applies(ctx):
    if len(ctx.case["mesh"]) != 1:
        return "this strategy shards over a 1-D mesh"
    return None


def parallelize(model, mesh, ctx):
    blocks = next(m for m in model.children() if isinstance(m, nn.ModuleList))
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block)
        fully_shard(blocks[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
