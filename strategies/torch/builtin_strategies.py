"""PyTorch's own strategies, applied as a user applies them: the torch/* executors' built-ins.

Each is what rank_runner.py calls a strategy: parallelize(model, mesh, ctx) written with
PyTorch's public API exactly as torchtitan and PyTorch's tutorials write it, the mesh's axis
names, the axes the batch is split over, and the deliberate misuses (ctx.fault) that the
planted-fault tests run to prove a wrong strategy fails its row.

  ddp            DistributedDataParallel over the whole mesh (gradients all-reduced in buckets,
                 averaged)
  fsdp2          fully_shard on every block of the model's layer list, then the root
                 (reshard_after_forward=True: each block gathered again for its backward)
  fsdp2-keep     the same with reshard_after_forward=False
  hsdp           fully_shard on a 2-D mesh (replicate, shard): sharded on axis 1, replicated on 0
                 (fsdp2, fsdp2-keep and hsdp: params.param_dtype: bfloat16 is FSDP2's
                 MixedPrecisionPolicy, computed in bfloat16, gradients reduced in float32)
  tp             parallelize_module with torchtitan's Megatron plan for a LLaMA written as Meta
                 writes it (wq/wk/wv/w1/w3 column-wise, wo/w2 row-wise, the embedding row-wise,
                 the output column-wise gathered): every rank the whole batch; on a GPT-2 with
                 HF's names the same plan with the fused qkv projection column-wise per part
                 (_StridedShard) and the tied embedding whole
  sp             the same with sequence parallelism (norms SequenceParallel, the residual stream
                 sharded on the sequence)
  checkpoint     torch.utils.checkpoint (non-reentrant) around every block, on one rank
  sac            selective activation checkpointing: the same with a policy that saves every
                 matmul's output and recomputes everything else
  cp             context_parallel where this PyTorch runs it on the mesh's device; on the CPU
                 (2.13) `unsupported` with PyTorch's reason
  pipeline-gpipe, pipeline-1f1b, pipeline-interleaved-1f1b, pipeline-interleaved-zb,
  pipeline-zbv   torch.distributed.pipelining's schedules on a LLaMA as Meta writes it, cut at
                 block boundaries, over the case's micro-batches
  pipeline-csv   a schedule from a file (params.csv, the package's compute-only CSV: row r rank
                 r's actions) loaded by _PipelineScheduleRuntime._load_csv, which adds the sends
                 and receives; the model cut into as many stages as the file names
  compose        torchtitan's composition on an N-D mesh (docs/compose.md): pipeline stages,
                 each tensor (and sequence) parallel, its blocks checkpointed, FSDP2 / HSDP over
                 the data-parallel axes, the schedule over the micro-batches, clipping by the
                 norm summed over the stages

Planted faults (ctx.fault):
  grad_divided_twice   ddp, fsdp2, hsdp: the loss not scaled to the batch's sum, so the mean the
                       strategy takes divides the gradients once more than the reference
  grads_scaled_by_microbatches
                       pipeline-*, compose: the schedule's default scale_grads=True left on under a
                       loss that is the batch's sum: every gradient divided by the micro-batch
                       count (the loss and its gradients scaled apart)
  partial_reported_whole
                       dtensor-linear: a result with pending sums handed back as its rank's
                       part, declared whole (a to_local() that forgets a Partial placement)
  clip_norm_one_axis   compose: clipping's norm not all-reduced over the pipeline's stages
  loss_not_mean_scaled compose: the loss not scaled for FSDP's mean over the data-parallel ranks
  output_not_tp        compose without SP: the output projection left out of the tp plan (every
                       number right; the layout check fails it)
  recompute_without_rng_state
                       checkpoint, sac: torch.utils.checkpoint with preserve_rng_state=False on a
                       model with dropout, so the recomputation draws other masks than the
                       forward did (a policy recomputing a random operator without its RNG
                       state)
  fused_qkv_colwise    tp, sp on GPT-2: plain ColwiseParallel on the fused qkv projection, so a
                       rank's rows are a run of [q; k; v] (q and half of k on rank 0 of 2), which
                       its attention splits as its heads of q, k and v: it runs, silently wrong
  norm_grad_partial    sp, compose: the norms left out of the plan, so each rank's norm weights see only
                       its part of the sequence: their gradients are partial sums, stepped as if
                       whole (torchtitan#1805's kind of bug)
"""

import functools

import torch
import torch.distributed as dist
import torch.nn as nn


class Unsupported(Exception):
    """Raised by parallelize(): the case cannot run this strategy (an `unsupported` row)."""


class _Children:
    """A module's numbered children as a list whose items can be replaced (a wrapper in place
    of a block), as an nn.ModuleList's can."""

    def __init__(self, module):
        self.module = module

    def __len__(self):
        return len(list(self.module.children()))

    def __iter__(self):
        return iter(list(self.module.children()))

    def __getitem__(self, i):
        return getattr(self.module, str(i))

    def __setitem__(self, i, value):
        setattr(self.module, str(i), value)


def layer_list(model):
    """The model's list of blocks: the first nn.ModuleList in it (a child, as Meta's and HF's
    `layers` / `h`, or deeper, as nn.TransformerEncoder's `encoder.layers`)."""
    for name, child in model.named_modules():
        if isinstance(child, nn.ModuleList):
            return name, child
    # An exported program unflattened (torch.export.unflatten) keeps the hierarchy, not the
    # container types: the first module whose children are named 0, 1, ... is the list.
    for name, child in model.named_modules():
        keys = [k for k, _ in child.named_children()]
        if len(keys) >= 2 and keys == [str(i) for i in range(len(keys))]:
            return name, _Children(child)
    raise Unsupported("the model has no nn.ModuleList of blocks to wrap one by one")


class Strategy:
    mesh_dim_names = None
    batch_axes = ()
    gradient_mean = True
    faults = ()

    def applies(self, ctx):
        if ctx.fault and ctx.fault not in self.faults:
            return f"no planted fault '{ctx.fault}' (this one has {list(self.faults)})"
        return None

    def loss_scale(self, ctx):
        # grad_divided_twice: the loss of a rank's rows unscaled, under a mean over the ranks.
        # None: the runner's own scale (the batch axes' size where the gradients are averaged).
        return 1 if ctx.fault == "grad_divided_twice" else None


class DDP(Strategy):
    mesh_dim_names = ("dp",)
    batch_axes = ("dp",)
    faults = ("grad_divided_twice",)

    def applies(self, ctx):
        if len(ctx.case["mesh"]) != 1:
            return "ddp runs on a 1-D mesh"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, process_group=mesh.get_group("dp"))


class FSDP2(Strategy):
    mesh_dim_names = ("dp",)
    batch_axes = ("dp",)
    faults = ("grad_divided_twice",)

    def __init__(self, reshard_after_forward=True, hsdp=False):
        self.reshard = reshard_after_forward
        if hsdp:
            self.mesh_dim_names = ("replicate", "shard")
            self.batch_axes = ("replicate", "shard")

    def applies(self, ctx):
        want = len(self.mesh_dim_names)
        if len(ctx.case["mesh"]) != want:
            return f"needs a {want}-D mesh ({', '.join(self.mesh_dim_names)})"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        from torch.distributed.fsdp import fully_shard
        kw = {"reshard_after_forward": self.reshard}
        # params.param_dtype: bfloat16 (the harness checked it): FSDP2's mixed precision, units
        # gathered and computed in bfloat16, gradients reduced into float32 shards.
        if ctx.params.get("param_dtype") == "bfloat16":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
        _, blocks = layer_list(model)
        for block in blocks:
            fully_shard(block, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        return model


def _meta_llama_layers(model):
    _, blocks = layer_list(model)
    need = ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "w1", "w2", "w3",
            "attention_norm", "ffn_norm")
    for block in blocks:
        names = dict(block.named_modules())
        if any(n not in names for n in need) or not hasattr(model, "tok_embeddings"):
            raise Unsupported("the tp/sp plans are written for a LLaMA as Meta writes it "
                              f"(tok_embeddings, layers[i].{{{', '.join(need)}}}, norm, output); "
                              "this model is not one")
    return blocks


def _gpt2_blocks(model):
    """The blocks of a GPT-2 with HF GPT-2's names (wte, wpe, h[i].{ln_1, attn.c_attn,
    attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f, lm_head), or None."""
    need = ("ln_1", "attn", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    blocks = getattr(model, "h", None)
    if not hasattr(model, "wte") or not isinstance(blocks, nn.ModuleList) or not len(blocks):
        return None
    for block in blocks:
        names = dict(block.named_modules())
        if any(n not in names for n in need):
            return None
        if not all(hasattr(block.attn, a) for a in ("d", "heads")):
            raise Unsupported("GPT-2's attention must keep its width and heads as attributes "
                              "(attn.d, attn.heads), which the tp plan divides by the ranks")
    return blocks


class TensorParallel(Strategy):
    mesh_dim_names = ("tp",)
    gradient_mean = False

    def __init__(self, sequence_parallel):
        self.sp = sequence_parallel
        self.faults = (("norm_grad_partial",) if sequence_parallel else ()) + ("fused_qkv_colwise",)

    def applies(self, ctx):
        if len(ctx.case["mesh"]) != 1:
            return "tp/sp run on a 1-D mesh (composed with FSDP: the composition issue)"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        gpt2 = _gpt2_blocks(model)
        if gpt2 is not None:
            apply_gpt2_tp(model, gpt2, mesh, self.sp, ctx.fault)
            return model
        if ctx.fault == "fused_qkv_colwise":
            raise Unsupported("the planted fault fused_qkv_colwise misplans GPT-2's fused qkv "
                              "projection; this model has none")
        blocks = _meta_llama_layers(model)
        apply_tp(model, blocks, mesh, self.sp, ctx.fault)
        return model


def fused_colwise(parts):
    """ColwiseParallel for a projection that computes `parts` outputs in one (GPT-2's c_attn:
    q, k and v): each rank holds its rows of every part, DTensor's _StridedShard(0,
    split_factor=parts), so that its output is its heads of q, of k and of v. DTensor's linear
    propagates the strided shard to the output's last dimension, whose local tensor is
    [q_r, k_r, v_r], and the output is handed on as it is: ColwiseParallel's own output step
    would redistribute it to Shard(-1), one run of [q; k; v] a rank again (with collectives),
    which the attention's split would take for its q, k and v."""
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel
    from torch.distributed.tensor.placement_types import _StridedShard

    class FusedColwise(ColwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            for n, p in list(module.named_parameters(recurse=False)):
                placed = distribute_tensor(p, device_mesh, [_StridedShard(0, split_factor=parts)])
                module.register_parameter(n, nn.Parameter(placed))

        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            return outputs.to_local() if use_local_output else outputs

    return FusedColwise()


def apply_gpt2_tp(model, blocks, mesh, sp, fault=None):
    """Megatron's plan on a GPT-2 with HF's names: the fused qkv projection column-wise per part
    (fused_colwise), attn.c_proj row-wise, mlp.c_fc column-wise, mlp.c_proj row-wise; each
    rank's attention its heads. The embedding is tied to the output (one parameter, two uses),
    so both stay whole on every rank, as do the position embedding and the norms. With `sp` the
    residual stream between the blocks is sharded on the sequence: the first block takes its
    rows of it, the norms run SequenceParallel, the attention and MLP gather it, their row-wise
    projections reduce-scatter, and the output gathers it again."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    tp = mesh.size(0)
    for block in blocks:
        a = block.attn
        if a.heads % tp:
            raise Unsupported(f"{a.heads} heads do not divide over {tp} tensor-parallel ranks")
    if sp:
        parallelize_module(model, mesh, {
            "h.0": PrepareModuleInput(input_layouts=(Replicate(),),
                                      desired_input_layouts=(Shard(1),), use_local_output=True),
            "ln_f": SequenceParallel(),
            "lm_head": PrepareModuleInput(input_layouts=(Shard(1),),
                                          desired_input_layouts=(Replicate(),),
                                          use_local_output=True)})
    for block in blocks:
        # Planted: ColwiseParallel on the fused projection, a rank's rows of [q; k; v] in one
        # run (rank 0 of 2: q and k's first half), which the attention splits as its q, k, v.
        qkv = ColwiseParallel() if fault == "fused_qkv_colwise" else fused_colwise(3)
        if sp:
            plan = {"ln_1": SequenceParallel(),
                    # The attention reads its input's shape (B, S): gathered, and handed on
                    # as a DTensor, so that c_attn's pending input gradient goes back as one
                    # reduce-scatter, not an all-reduce and a chunk.
                    "attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),),
                                               use_local_output=False),
                    "attn.c_attn": qkv,
                    "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
                    "ln_2": SequenceParallel(),
                    "mlp.c_fc": ColwiseParallel(input_layouts=Shard(1)),
                    "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1))}
            if fault == "norm_grad_partial":
                del plan["ln_1"], plan["ln_2"]
        else:
            plan = {"attn.c_attn": qkv, "attn.c_proj": RowwiseParallel(),
                    "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
        parallelize_module(block, mesh, plan)
        # Each rank's attention runs its share of the heads, its width with them.
        block.attn.heads //= tp
        block.attn.d //= tp


def apply_tp(model, blocks, mesh, sp, fault=None):
    """torchtitan's Megatron plan on `model` (a whole LLaMA as Meta writes it, or a pipeline
    stage of one: the root's embedding, norm and output where it holds them) and its `blocks`,
    over the 1-D tensor-parallel mesh `mesh`; with `sp` the norms and the residual stream are
    sharded on the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    tp = mesh.size(0)
    for block in blocks:
        a = block.attention
        if a.heads % tp or a.kv_heads % tp:
            raise Unsupported(f"{a.heads} heads and {a.kv_heads} kv heads do not divide over "
                              f"{tp} tensor-parallel ranks")
    if sp:
        root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(),
                                                  output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1),
                                          output_layouts=Replicate())}
    else:
        root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                "output": ColwiseParallel(output_layouts=Replicate())}
    if fault == "norm_grad_partial":
        root.pop("norm")
    if fault == "output_not_tp" and not sp:
        root.pop("output")
    root = {k: v for k, v in root.items() if hasattr(model, k)}
    if root:
        parallelize_module(model, mesh, root)
    for block in blocks:
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel()}
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(),
                # As torchtitan: the gathered input handed on as a DTensor, so that the
                # three projections' pending input gradients are summed and go back as one
                # reduce-scatter (a local tensor here made them three all-reduces).
                "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                                desired_input_layouts=(Replicate(),),
                                                use_local_output=False),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "w1": ColwiseParallel(input_layouts=Shard(1)),
                "w3": ColwiseParallel(input_layouts=Shard(1)),
                "w2": RowwiseParallel(output_layouts=Shard(1))})
            if fault == "norm_grad_partial":
                del plan["attention_norm"], plan["ffn_norm"]
        else:
            # The attention's input as a Replicate DTensor: the three projections' pending
            # input gradients summed and all-reduced once, not once each.
            plan.update({"attention": PrepareModuleInput(input_layouts=(Replicate(),),
                                                         desired_input_layouts=(Replicate(),),
                                                         use_local_output=False),
                         "attention.wo": RowwiseParallel(), "w1": ColwiseParallel(),
                         "w3": ColwiseParallel(), "w2": RowwiseParallel()})
        parallelize_module(block, mesh, plan)
        # Each rank's attention runs its share of the heads (Meta's n_local_heads).
        block.attention.heads //= tp
        block.attention.kv_heads //= tp


class Checkpoint(Strategy):
    mesh_dim_names = ("dp",)
    gradient_mean = False
    faults = ("recompute_without_rng_state",)

    def __init__(self, selective):
        self.selective = selective

    def applies(self, ctx):
        if ctx.case["mesh"] != [1]:
            return "checkpointing runs on one rank (mesh: 1)"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        # torch/sac: params.policy names the policy (the harness checked it): stratbench's
        # checkpointing/sac/<name> decides the same per operator, for a side-by-side row.
        policy = ctx.params.get("policy", "matmuls") if self.selective else None
        # recompute_without_rng_state: preserve_rng_state=False, so a recomputed random operator
        # (dropout's bernoulli_) draws again from where the generator has moved on: other masks
        # in the backward than in the forward.
        checkpoint_blocks(layer_list(model)[1], policy,
                          preserve_rng_state=ctx.fault != "recompute_without_rng_state")
        return model


def block_keys(container):
    """The keys of a container of blocks: a ModuleDict's names, a list's indices."""
    return list(container.keys()) if isinstance(container, nn.ModuleDict) else \
        list(range(len(container)))


def checkpoint_blocks(container, selective, preserve_rng_state=True):
    """Every block of `container` (a ModuleList, a ModuleDict, a module's numbered children) in
    checkpoint_wrapper (non-reentrant), in place; `selective` (True, or a policy's name: see
    sac_policy) through create_selective_checkpoint_contexts with that policy, a fresh one per
    block (torchtitan's counts per block)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import \
        checkpoint_wrapper
    for key in block_keys(container):
        kw = {} if preserve_rng_state else {"preserve_rng_state": False}
        if selective:
            from torch.utils.checkpoint import create_selective_checkpoint_contexts
            name = "matmuls" if selective is True else selective
            kw["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                 sac_policy(name))
        container[key] = checkpoint_wrapper(container[key], **kw)


def sac_policy(name):
    """A selective policy by name, per ATen operator as PyTorch's SAC sees them: "matmuls" (every
    matmul's output saved), and the built-ins of stratbench's checkpointing/sac/<name>
    (docs/checkpointing.md): "save-all", "recompute-all", "torchtitan" (torchtitan's policy:
    mm, SDPA, reduce-scatter and max saved but every second mm of a block; a linear with a bias
    is addmm here, counted as its mm, as stratbench counts it), "cheap" (the pointwise operators
    and the norms recomputed, the rest saved)."""
    from collections import defaultdict
    from torch.utils.checkpoint import CheckpointPolicy
    aten = torch.ops.aten
    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    if name == "matmuls":
        return save_matmuls
    if name == "save-all":
        return lambda ctx, op, *args, **kwargs: save
    if name == "recompute-all":
        return lambda ctx, op, *args, **kwargs: recompute
    if name == "cheap":
        norms = {aten.native_layer_norm.default, aten._softmax.default,
                 aten._fused_rms_norm.default if hasattr(aten, "_fused_rms_norm") else None,
                 aten.rsqrt.default, aten.mean.dim, aten.pow.Tensor_Scalar,
                 aten.native_dropout.default}

        def cheap(ctx, op, *args, **kwargs):
            pointwise = torch.Tag.pointwise in getattr(op, "tags", ())
            return recompute if pointwise or op in norms else save
        return cheap
    if name == "torchtitan":
        mms = {aten.mm.default, aten.addmm.default}
        kept = mms | {aten._scaled_dot_product_efficient_attention.default,
                      aten._scaled_dot_product_flash_attention.default, aten.max.default}
        if hasattr(torch.ops, "_c10d_functional"):
            kept.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
        meta = defaultdict(int)

        def torchtitan(ctx, op, *args, **kwargs):
            key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
            if op in mms:
                meta[key] += 1
            return save if op in kept and not (op in mms and meta[key] % 2 == 0) else recompute
        return torchtitan
    raise Unsupported(f"no selective policy named {name!r}")


def save_matmuls(ctx, op, *args, **kwargs):
    """The selective policy: every matmul's output saved, everything else recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy
    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
               torch.ops.aten.bmm.default, torch.ops.aten.matmul.default)
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


class _Stage(nn.Module):
    """One pipeline stage of a LLaMA as Meta writes it, holding the model's own submodules under
    their own names (layers in a ModuleDict keyed by index, as torchtitan keeps them), so that
    every parameter keeps the name the traced graph gives it."""

    def __init__(self, model, units):
        super().__init__()
        if "emb" in units:
            self.tok_embeddings = model.tok_embeddings
        self.layers = nn.ModuleDict({str(u): model.layers[u] for u in units if isinstance(u, int)})
        if "head" in units:
            self.norm, self.output = model.norm, model.output

    def forward(self, h):
        if hasattr(self, "tok_embeddings"):
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h)
        if hasattr(self, "output"):
            h = self.output(self.norm(h)).float()
        return h


V_SCHEDULES = ("zbv", "dualpipev")


def stage_cut(model, pp, stages_per_rank, rank, v_shape=False):
    """A LLaMA as Meta writes it cut into pp x stages_per_rank stages at block boundaries: the
    pieces (embedding, each block, norm and output) in contiguous runs as even as torch.chunk
    makes them, stage k on rank k % pp (looped, as the interleaved schedules place them), or with
    `v_shape` two stages a rank in a V (rank r holds stages r and 2 pp - 1 - r, as the ZBV and
    DualPipeV schedules place them). Returns every stage's pieces and the stages of `rank`."""
    bounds = cut_units(model, pp * stages_per_rank)
    if v_shape:
        if stages_per_rank != 2:
            raise Unsupported(f"a V-shaped schedule places two stages a rank, not {stages_per_rank}")
        return bounds, [rank, 2 * pp - 1 - rank]
    return bounds, [k for k in range(len(bounds)) if k % pp == rank]


def cut_units(model, n_stages):
    """A LLaMA as Meta writes it as `n_stages` contiguous runs of its pieces (embedding, each
    block, norm and output), as even as torch.chunk makes them: each stage's pieces."""
    if not (hasattr(model, "tok_embeddings") and hasattr(model, "layers")
            and hasattr(model, "norm") and hasattr(model, "output")):
        raise Unsupported("the stage cuts are written for a LLaMA as Meta writes it "
                          "(tok_embeddings, layers, norm, output)")
    units = ["emb"] + list(range(len(model.layers))) + ["head"]
    if len(units) < n_stages:
        raise Unsupported(f"{len(units)} pieces (embedding, {len(model.layers)} blocks, head) "
                          f"cannot fill {n_stages} stages")
    bounds, start = [], 0
    for k in range(n_stages):
        size = len(units) // n_stages + (1 if k < len(units) % n_stages else 0)
        bounds.append(units[start:start + size])
        start += size
    return bounds


def make_schedule(name, stages, microbatches, loss_fn, scale_grads):
    """torch.distributed.pipelining's schedule `name` over this rank's `stages`: gpipe, 1f1b (one
    stage a rank), interleaved-1f1b, interleaved-zb (ScheduleInterleavedZeroBubble: the
    backward split into input and weight gradients), zbv and dualpipev (V-shaped placement)."""
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                              ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble,
                                              ScheduleZBVZeroBubble)
    multi = {"interleaved-1f1b": ScheduleInterleaved1F1B,
             "interleaved-zb": ScheduleInterleavedZeroBubble,
             "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
    if name in multi:
        try:
            return multi[name](stages, n_microbatches=microbatches, loss_fn=loss_fn,
                               scale_grads=scale_grads)
        except ValueError as e:  # the schedule refuses the case's shape (too few micro-batches)
            raise Unsupported(f"{name}: {e}")
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(name)
    if kind is None:
        raise ValueError(f"schedule '{name}' (expected gpipe, 1f1b, interleaved-1f1b, "
                         "interleaved-zb, zbv or dualpipev)")
    if len(stages) != 1:
        raise Unsupported(f"{name} runs one stage a rank; {len(stages)} stages need "
                          "interleaved-1f1b")
    return kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn,
                scale_grads=scale_grads)


def pipeline_refusal(case):
    """Why a case cannot run a pipeline schedule, or None."""
    if case["steps"] == 0:
        return "a pipeline runs training steps (its output stays on the last stage)"
    if case.get("microbatches", 1) < 2:
        return "the schedule needs the case's micro-batches (shape key microbatches)"
    return None


def pipeline_stages(modules, mine, n_stages, group):
    """PipelineStage objects for this rank's stage modules (`mine`: their indices)."""
    from torch.distributed.pipelining import PipelineStage
    return [PipelineStage(m, k, n_stages, torch.device("cpu"), group=group)
            for m, k in zip(modules, mine)]


def schedule_step(run, first, last, inputs, target):
    """One step of the schedule `run`: the inputs fed where the first stage is, the target where
    the last is. The last stage's micro-batch losses summed (float64); zero elsewhere."""
    losses = []
    args = inputs if first else ()
    kwargs = {"target": target, "losses": losses} if last else {}
    run.step(*args, **kwargs)
    if not last:
        return torch.zeros((), dtype=torch.float64)
    return sum(l.detach().double() for l in losses)


class Pipeline(Strategy):
    """torch.distributed.pipelining: the model cut into stages at block boundaries (the embedding
    with the first blocks, the norm and the output with the last), one stage per rank (two,
    looped, for the interleaved schedule), run by PyTorch's schedule over the case's
    micro-batches. Each micro-batch's loss is its part of the batch's sum; the schedule
    accumulates the gradients of every micro-batch. Parameters live on their stage's rank only."""
    mesh_dim_names = ("pp",)
    gradient_mean = False
    plain_param_copies = 1  # a parameter is on one rank: its stage's
    faults = ("grads_scaled_by_microbatches",)

    def __init__(self, schedule, stages_per_rank=1):
        self.schedule = schedule
        self.stages_per_rank = stages_per_rank

    def applies(self, ctx):
        if len(ctx.case["mesh"]) != 1:
            return "a pipeline runs on a 1-D mesh"
        return pipeline_refusal(ctx.case) or super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        pp = mesh.size(0)
        rank = mesh.get_local_rank(0)
        if self.schedule == "csv":
            # The file says which rank runs each stage (csv_stage_rank: as the harness read it);
            # the model is cut into that many stages.
            owner = ctx.case["csv_stage_rank"]
            bounds = cut_units(model, len(owner))
            mine = [k for k, r in enumerate(owner) if r == rank]
        else:
            bounds, mine = stage_cut(model, pp, self.stages_per_rank, rank,
                                     v_shape=self.schedule in V_SCHEDULES)
        n_stages = len(bounds)
        stages = pipeline_stages([_Stage(model, bounds[k]) for k in mine], mine, n_stages,
                                 mesh.get_group(0))
        M = ctx.case["microbatches"]

        def loss_fn(out, target):
            return (out * target).sum()
        # The schedule divides the gradients by the micro-batch count unless told not to
        # (scale_grads, for a loss that is a mean per micro-batch). A micro-batch's loss here is
        # its part of the batch's sum: nothing to divide. grads_scaled_by_microbatches leaves
        # the default on, as a user whose loss is a sum and who never read the flag does.
        scale_grads = ctx.fault == "grads_scaled_by_microbatches"
        if self.schedule == "csv":
            # The runtime PyTorch's own tests load CSV schedules into: the compute-only actions
            # lowered with the sends and receives they imply.
            from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
            self.run = _PipelineScheduleRuntime(stages, n_microbatches=M, loss_fn=loss_fn,
                                                scale_grads=scale_grads)
            self.run._load_csv(ctx.params["csv"], format="compute_only")
        else:
            self.run = make_schedule(self.schedule, stages, M, loss_fn, scale_grads)
        self.first = 0 in mine
        self.last = (n_stages - 1) in mine
        # What this rank holds, under the model's own names (its stages share these modules).
        return _Stage(model, [u for k in mine for u in bounds[k]])

    def forward_backward(self, model, inputs, target, ctx):
        """One step's forward and backward by the schedule; this rank's part of the batch's loss
        (the last stage's micro-batch losses, nothing elsewhere)."""
        return schedule_step(self.run, self.first, self.last, inputs, target)


COMPOSE_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
COMPOSE_DEFAULT_AXES = {1: ("dp_shard",), 2: ("dp_shard", "tp"), 3: ("pp", "dp_shard", "tp"),
                        4: ("pp", "dp_replicate", "dp_shard", "tp")}


class Compose(Strategy):
    """torchtitan's composition of PyTorch's own pieces on one N-D mesh, in torchtitan's order:
    the model cut into pipeline stages (pp), each stage tensor parallel (torchtitan's Megatron
    plan, with sequence parallelism unless params.sp is false), its blocks checkpointed
    (params.ac: none, full, or selective: matmuls saved), then fully_shard'ed per block and per
    stage over the data-parallel axes (dp_shard; HSDP with dp_replicate), the stages run by
    torch.distributed.pipelining's schedule (params.schedule: gpipe, 1f1b, interleaved-1f1b with
    params.virtual_stages) over the case's micro-batches. The mesh's axes are named by
    params.axes (from pp, dp_replicate, dp_shard, tp; outermost first, as torchtitan orders them),
    by default from the mesh's rank: [dp_shard], [dp_shard, tp], [pp, dp_shard, tp],
    [pp, dp_replicate, dp_shard, tp]. Clipping by the global norm is torchtitan's too: the norm
    of the DTensor gradients (over dp and tp) squared, all-reduced over pp, and every gradient
    scaled by max_norm / norm."""
    faults = ("clip_norm_one_axis", "norm_grad_partial", "grads_scaled_by_microbatches",
              "loss_not_mean_scaled", "output_not_tp")

    @staticmethod
    def axes(case):
        names = case.get("params", {}).get("axes")
        if names is None:
            return COMPOSE_DEFAULT_AXES.get(len(case["mesh"]))
        return tuple(names)

    def mesh_dim_names(self, case):
        names = self.axes(case)
        return names if names is not None else ()

    def batch_axes(self, names):
        return tuple(a for a in ("dp_replicate", "dp_shard") if a in names)

    def applies(self, ctx):
        names = self.axes(ctx.case)
        if names is None:
            return (f"a {len(ctx.case['mesh'])}-D mesh needs params.axes (names from "
                    f"{list(COMPOSE_AXES)})")
        bad = [a for a in names if a not in COMPOSE_AXES]
        if bad or len(set(names)) != len(names) or len(names) != len(ctx.case["mesh"]):
            return (f"params.axes {list(names)}: one name a mesh axis "
                    f"({len(ctx.case['mesh'])}), each once, from {list(COMPOSE_AXES)}")
        if "cp" in names:
            return ("cp: PyTorch's context_parallel does not run on the CPU (see torch/cp); "
                    "stratbench's own CP composes in sharding/compose")
        if "dp_replicate" in names and "dp_shard" not in names:
            return "dp_replicate (HSDP) needs a dp_shard axis beside it"
        if "pp" in names and pipeline_refusal(ctx.case):
            return pipeline_refusal(ctx.case)
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        from torch.distributed.fsdp import fully_shard
        names = mesh.mesh_dim_names
        params = ctx.params
        size = {n: mesh.size(i) for i, n in enumerate(names)}
        self.tp = size.get("tp", 1)
        dp_axes = self.batch_axes(names)
        self.dp = 1
        for a in dp_axes:
            self.dp *= size[a]
        self.pp = size.get("pp", 1)
        # The pieces this rank holds: the whole model, or its pipeline stages.
        if self.pp > 1:
            M = ctx.case["microbatches"]
            if ctx.rows % M:
                raise Unsupported(f"a data-parallel replica's {ctx.rows} rows do not divide into "
                                  f"{M} micro-batches")
            schedule = params.get("schedule", "1f1b")
            multi = schedule not in ("gpipe", "1f1b")
            v = int(params.get("virtual_stages", 2 if multi else 1))
            bounds, mine = stage_cut(model, self.pp, v, mesh["pp"].get_local_rank(),
                                     v_shape=schedule in V_SCHEDULES)
            parts = [_Stage(model, bounds[k]) for k in mine]
        else:
            _meta_llama_layers(model)
            parts = [model]
        # params' values were checked by the harness (exit 2 naming the key).
        ac = params.get("ac", "none")
        for part in parts:
            if self.tp > 1:
                apply_tp(part, [part.layers[k] for k in block_keys(part.layers)], mesh["tp"],
                         bool(params.get("sp", True)), ctx.fault)
            if ac != "none":
                checkpoint_blocks(part.layers, ac == "selective")
            if dp_axes:
                dp_mesh = mesh[dp_axes] if len(dp_axes) > 1 else mesh[dp_axes[0]]
                # torchtitan keeps the blocks gathered between forward and backward under a
                # pipeline (each micro-batch would gather them again).
                keep = self.pp == 1
                for key in block_keys(part.layers):
                    fully_shard(part.layers[key], mesh=dp_mesh, reshard_after_forward=keep)
                fully_shard(part, mesh=dp_mesh, reshard_after_forward=keep)
        # Every rank's loss is its rows' sum; FSDP averages the gradients over the data-parallel
        # ranks, so the loss a backward starts from is scaled by their count.
        self.scale = 1 if ctx.fault == "loss_not_mean_scaled" else self.dp
        if self.pp == 1:
            self.run = None
            return parts[0]
        n_stages = len(bounds)
        stages = pipeline_stages(parts, mine, n_stages, mesh["pp"].get_group())
        scale = self.scale

        def loss_fn(out, target):
            return (out * target).sum() * scale
        self.run = make_schedule(params.get("schedule", "1f1b"), stages,
                                 ctx.case["microbatches"], loss_fn,
                                 ctx.fault == "grads_scaled_by_microbatches")
        self.first = 0 in mine
        self.last = (n_stages - 1) in mine
        return _Stage(model, [u for k in mine for u in bounds[k]]) if len(parts) > 1 else parts[0]

    def forward_backward(self, model, inputs, target, ctx):
        """One step's forward and backward; this rank's part of the batch's loss (summed over
        the ranks: a data-parallel replica's rows, divided among the tp ranks that hold the same
        copy; nothing on a stage before the last)."""
        if self.run is None:
            out = model(*inputs)
            out = out.to_local() if hasattr(out, "to_local") else out
            loss = (out * target).sum()
            (loss * self.scale).backward()
            return loss.detach().double() / self.tp
        loss = schedule_step(self.run, self.first, self.last, inputs, target)
        return loss / (self.scale * self.tp)

    def param_split(self, names, mesh):
        """How many ways the parameters are split (not copied) across ranks: the pipeline's
        stages."""
        return mesh.size(names.index("pp")) if "pp" in names else 1

    def clip_grad_norm(self, params, max_norm, ctx):
        """torchtitan's clip_grad_norm_: the DTensor gradients' norm (DTensor reduces it over
        the axes it is sharded on), squared and summed over the pipeline's stages, then every
        gradient scaled. clip_norm_one_axis leaves out the stages' sum: each stage clips by its
        own part of the norm."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor
        # Gradients on different meshes (a parameter left out of the tp plan is FSDP's alone)
        # cannot be stacked into one norm: each mesh's norm is taken apart, then combined.
        groups = {}
        for p in params:
            if p.grad is not None:
                key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
                groups.setdefault(key, []).append(p.grad)
        squares = torch.zeros(())
        for grads in groups.values():
            part = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=False)
            if isinstance(part, DTensor):
                part = part.full_tensor()
            squares = squares + part.float() ** 2
        if self.pp > 1 and ctx.fault != "clip_norm_one_axis":
            dist.all_reduce(squares, group=ctx.mesh["pp"].get_group())
        norm = squares ** 0.5
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=False)
        return norm


class ContextParallel(Strategy):
    """context_parallel (torch.distributed.tensor.experimental): asks this PyTorch whether it
    runs on the mesh's device by running causal SDPA under it on a small batch; where it does
    not (2.13 on the CPU: the CPU's SDPA kernel has no sharding strategy), the row is
    `unsupported` with PyTorch's own words. Where it does, the executor that shards a model's
    sequence is not written yet, and the row says that instead."""
    mesh_dim_names = ("cp",)
    gradient_mean = False

    def parallelize(self, model, mesh, ctx):
        import torch.nn.functional as F
        from torch.distributed.tensor.experimental import context_parallel
        q, k, v = (torch.randn(1, 2, 4 * mesh.size(0), 8) for _ in range(3))
        try:
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                a, b, c = (t.detach().requires_grad_() for t in (q, k, v))
                F.scaled_dot_product_attention(a, b, c, is_causal=True).sum().backward()
        except Exception as e:
            raise Unsupported(f"context_parallel does not run here (PyTorch {torch.__version__}, "
                              f"{mesh.device_type}): {type(e).__name__}: {e}")
        raise Unsupported("context_parallel runs here, but the torch/cp executor that shards a "
                          "model's sequence under it is not written yet")


class DTensorOperator(Strategy):
    """DTensor's own operator on inputs laid out as the case says: the runner places the
    operands (workload linear: input, weight, bias) and runs F.linear's forward and backward;
    nothing to parallelize."""
    gradient_mean = False
    faults = ("partial_reported_whole",)

    def applies(self, ctx):
        if ctx.case["workload"] != "linear":
            return "DTensor's operators run on the linear workload"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        return model


class ExpertParallel(Strategy):
    """Expert parallelism on a PyTorch MoE layer (workload moe; moe_layer.py's contract, a
    user's layer or the built-in one), as torchtitan applies it: the experts' w1, w3, w2
    distributed over the ep axis as DTensors sharded on dim 0 (contiguous experts a rank) by a
    ParallelStyle whose input_fn dispatches the rows sorted by expert to their experts' ranks
    and whose output_fn combines them back: the counts per expert exchanged first by an
    all_to_all_single, then the rows by the functional all_to_all_single_autograd with uneven
    splits (the backward is the reverse all-to-all), regrouped by local expert in between. The
    batch's tokens split over every axis ([ep], or [dp, ep]: chunk d ep + e); the router
    replicated, its gradient all-reduced over every rank; the experts' all-reduced over their
    replicas (dp); the load-balancing loss's counts over the whole batch (the layer's
    aux_group). Gradients are the batch's sums (no mean), as the reference's."""
    gradient_mean = False
    faults = ("grads_scaled_by_ep", "router_grad_partial", "experts_reduced_over_dp")

    @staticmethod
    def mesh_dim_names(case):
        axes = case.get("params", {}).get("axes")
        if axes:
            return tuple(axes)
        return ("ep",) if len(case["mesh"]) == 1 else ("dp", "ep")

    @staticmethod
    def batch_axes(names):
        return tuple(names)

    def applies(self, ctx):
        if ctx.case["workload"] != "moe":
            return "torch/ep runs the moe workload"
        names = self.mesh_dim_names(ctx.case)
        if names not in (("ep",), ("dp", "ep")):
            return f"torch/ep runs on a mesh [ep] or [dp, ep], not {list(names)}"
        return super().applies(ctx)

    def parallelize(self, model, mesh, ctx):
        from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
        from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module
        experts = getattr(model, "experts", None)
        if experts is None:
            raise ValueError("the MoE layer has no `experts` submodule for expert parallelism "
                             "to shard (moe_layer.py says what torch/ep relies on)")
        ep_mesh = mesh["ep"]
        E = ctx.case["shape"].get("experts", 4)
        if E % ep_mesh.size():
            raise Unsupported(f"{E} experts do not divide over {ep_mesh.size()} EP ranks")

        def shard_experts(name, module, device_mesh):
            for n, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(
                    n, nn.Parameter(distribute_tensor(p.data, device_mesh, [Shard(0)])))

        class Dispatch(ParallelStyle):
            def _apply(self, module, device_mesh):
                return distribute_module(module, device_mesh, shard_experts,
                                         input_fn=self.dispatch, output_fn=self.combine)

            def dispatch(self, module, inputs, device_mesh):
                import torch.distributed._functional_collectives as funcol
                rows, counts = inputs
                ep, group = device_mesh.size(), device_mesh.get_group()
                mine = counts.numel() // ep
                # received[r, e]: the rows rank r sends to this rank's local expert e.
                received = funcol.wait_tensor(funcol.all_to_all_single(counts, None, None, group))
                received = received.view(ep, mine)
                send = counts.view(ep, mine).sum(1).tolist()
                recv = received.sum(1).tolist()
                got = funcol.all_to_all_single_autograd(rows, recv, send, group)
                # From (source rank, local expert) order to (local expert, source rank).
                start = torch.cumsum(received.reshape(-1), 0) - received.reshape(-1)
                perm = [torch.arange(int(start[r * mine + e]),
                                     int(start[r * mine + e] + received[r, e]))
                        for e in range(mine) for r in range(ep)]
                perm = torch.cat(perm) if perm else torch.zeros(0, dtype=torch.long)
                module._sb_route = (perm, send, recv, group)
                return got[perm], received.sum(0)

            def combine(self, module, out, device_mesh):
                import torch.distributed._functional_collectives as funcol
                perm, send, recv, group = module._sb_route
                back = torch.empty_like(out).index_copy(0, perm, out) if perm.numel() else out
                return funcol.all_to_all_single_autograd(back, send, recv, group)

        parallelize_module(experts, ep_mesh, Dispatch())
        if hasattr(model, "aux_group"):
            model.aux_group = dist.group.WORLD
        return model

    def reduce_gradients(self, model, ctx):
        """After the backward, in one order on every rank: the router's (every other non-expert
        parameter's) gradients all-reduced over every rank, the experts' over their replicas."""
        experts = {id(p) for p in model.experts.parameters()}
        mesh = ctx.mesh
        ep = mesh["ep"].size()
        replicas = mesh["dp"].get_group() if "dp" in mesh.mesh_dim_names else None
        for _, p in model.named_parameters():
            if p.grad is None:  # an expert no row reached still takes part in the reductions
                p.grad = torch.zeros_like(p)
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if id(p) not in experts:
                if ctx.fault != "router_grad_partial":  # planted: left partial (torchtitan#2387)
                    dist.all_reduce(g)
                continue
            if ctx.fault == "experts_reduced_over_dp":
                # Planted: over the whole data-parallel group, which holds other experts
                # (Megatron-LM#1628).
                dist.all_reduce(g)
            elif replicas is not None:
                dist.all_reduce(g, group=replicas)
            if ctx.fault == "grads_scaled_by_ep":
                g.mul_(ep)  # planted: a mean over the EP ranks undone twice (pytorch#160285)


STRATEGIES = {
    "ddp": DDP(),
    "fsdp2": FSDP2(reshard_after_forward=True),
    "fsdp2-keep": FSDP2(reshard_after_forward=False),
    "hsdp": FSDP2(hsdp=True),
    "tp": TensorParallel(sequence_parallel=False),
    "sp": TensorParallel(sequence_parallel=True),
    "checkpoint": Checkpoint(selective=False),
    "sac": Checkpoint(selective=True),
    "pipeline-gpipe": Pipeline("gpipe"),
    "pipeline-1f1b": Pipeline("1f1b"),
    "pipeline-interleaved-1f1b": Pipeline("interleaved-1f1b", stages_per_rank=2),
    "pipeline-interleaved-zb": Pipeline("interleaved-zb", stages_per_rank=2),
    "pipeline-zbv": Pipeline("zbv", stages_per_rank=2),
    "pipeline-csv": Pipeline("csv"),
    "dtensor-linear": DTensorOperator(),
    "cp": ContextParallel(),
    "compose": Compose(),
    "ep": ExpertParallel(),
}
