"""One rank of a torch/* executor: PyTorch's own strategy run as a stratbench row.

The harness (strategies/torch/torch_strategy.cpp) starts one of these per rank, with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them, stdin carrying its commands
(one JSON object a line) and the file descriptor SB_REPLY_FD its replies; stdout and stderr go to
a log the harness quotes when something fails. The ranks meet in a torch.distributed gloo group,
build a DeviceMesh of the case's shape, and run the strategy there as a user's training loop
would. The harness keeps the case, the reference, the verdicts and the record; this file only
runs steps and hands back what they left.

Commands and replies:
  prepare {case, bundle}  reads the initial parameters, the data inputs and the target from the
                          bundle (tensor_bundle.py) the harness wrote, builds the model (the
                          Python module the case's TorchScript file was traced from), hands it to
                          the strategy's parallelize(), and keeps its initial local tensors.
                          -> {ok, torch} | {unsupported: why}
  step {measure}          runs the case: `steps` optimizer steps (or one forward and backward)
                          from the initial parameters, every time. With measure, the
                          collectives are counted (a dispatch mode over c10d's and the
                          functional collectives' operators) and the tensor allocations
                          profiled. -> {ok, seconds[, comm, peak_bytes, start_bytes]}
  results {path}          writes this rank's local tensors, named as the reference names them,
                          and their placements on the whole mesh (a strided shard's as
                          {view, placements}: those of a view splitting the sharded
                          dimension, split_view). -> {ok}
  exit
Any failure replies {error: text, traceback}; the harness records the row as an error.

A strategy (builtin_strategies.py, or a user's file) is a module or object with:
  parallelize(model, mesh, ctx) -> model     required: what the user's own code does
  MESH_DIM_NAMES / mesh_dim_names            the mesh's axis names (default dim0, dim1, ...);
                                             or a function of the case returning them
  BATCH_AXES / batch_axes                    the axes the batch is split over (default none);
                                             or a function of the axis names returning them
  GRADIENT_MEAN / gradient_mean              True where the gradients are averaged over the
                                             batch axes (DDP, FSDP: the default); the loss of a
                                             rank is then scaled by their size so that the
                                             gradients are the sum the reference computes
  applies(ctx) -> None | str                 why the case cannot run (an `unsupported` row)
  forward_backward(model, inputs, target, ctx) -> loss
                                             a strategy that runs the step's forward and
                                             backward itself (a pipeline schedule): this rank's
                                             part of the batch's loss, summed over the ranks
  plain_param_copies                         how many ranks hold each plain parameter (a
                                             pipeline's: 1; default every rank)
  param_split(names, mesh) -> int            how many ways the parameters are split (not
                                             copied) over the mesh (a composition's pipeline
                                             stages; default 1)
  clip_grad_norm(params, max_norm, ctx)      clips the gradients as the strategy's training
                                             loop does (default: the runner scales them by
                                             max_norm / the global norm it computed)
  loss_scale(ctx) -> None | number           what a rank's loss is multiplied by before its
                                             backward (None: the batch axes' size where
                                             GRADIENT_MEAN holds, else 1)
  reduce_gradients(model, ctx)               called after every backward of a MoE layer (in one
                                             order on every rank): the strategy's own gradient
                                             reductions (expert parallelism's)

The moe workload (moe_layer.py): the model is a MoE layer built from the case's shape; it returns
(output, its share of the load-balancing loss) and reports its routing, which the results carry
beside the reference's other names (aux_loss, expert_index, kept, tokens_per_expert, grad_input,
grad_router, grad_w1, ...).
"""

import contextlib
import gc
import importlib.util
import json
import os
import sys
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# tensor_bundle.py lives in reference/ (the export script writes bundles too).
sys.path.insert(1, os.path.join(HERE, "..", "..", "reference"))


def reply_channel():
    fd = int(os.environ.get("SB_REPLY_FD", "1"))
    return os.fdopen(fd, "w", buffering=1)


try:
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    import tensor_bundle
except Exception as e:  # a missing or broken PyTorch: every command says so
    IMPORT_ERROR = f"{type(e).__name__}: {e}"
else:
    IMPORT_ERROR = None


# ---- Counting collectives -------------------------------------------------------------------
# Bytes follow stratbench's convention (harness/comm/comm.h, nccl-tests' "size"): all-reduce and
# broadcast the buffer, all-gather the gathered output, reduce-scatter the full input,
# all-to-all the send buffer, a send its bytes and a receive none.
def _nbytes(x):
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


COLLECTIVES = {
    "c10d::allreduce_": ("all_reduce", lambda a: _nbytes(a[0])),
    "c10d::allreduce_coalesced_": ("all_reduce", lambda a: _nbytes(a[0])),
    "c10d::allgather_": ("all_gather", lambda a: _nbytes(a[0])),
    "c10d::_allgather_base_": ("all_gather", lambda a: _nbytes(a[0])),
    "c10d::allgather_coalesced_": ("all_gather", lambda a: _nbytes(a[0])),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", lambda a: _nbytes(a[0])),
    "c10d::reduce_scatter_": ("reduce_scatter", lambda a: _nbytes(a[1])),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", lambda a: _nbytes(a[1])),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", lambda a: _nbytes(a[1])),
    "c10d::alltoall_": ("all_to_all", lambda a: _nbytes(a[1])),
    "c10d::alltoall_base_": ("all_to_all", lambda a: _nbytes(a[1])),
    "c10d::broadcast_": ("broadcast", lambda a: _nbytes(a[0])),
    "c10d::barrier": ("barrier", lambda a: 0),
    "c10d::send": ("send_recv", lambda a: _nbytes(a[0])),
    "c10d::recv_": ("send_recv", lambda a: 0),
    "c10d::recv_any_source_": ("send_recv", lambda a: 0),
    "_c10d_functional::all_reduce": ("all_reduce", lambda a: _nbytes(a[0])),
    "_c10d_functional::all_reduce_": ("all_reduce", lambda a: _nbytes(a[0])),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", lambda a: _nbytes(a[0])),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", lambda a: _nbytes(a[0]) * a[1]),
    "_c10d_functional::all_gather_into_tensor_coalesced":
        ("all_gather", lambda a: _nbytes(a[0]) * a[1]),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", lambda a: _nbytes(a[0])),
    "_c10d_functional::reduce_scatter_tensor_coalesced":
        ("reduce_scatter", lambda a: _nbytes(a[0])),
    "_c10d_functional::all_to_all_single": ("all_to_all", lambda a: _nbytes(a[0])),
    "_c10d_functional::broadcast": ("broadcast", lambda a: _nbytes(a[0])),
}
NOT_COLLECTIVES = {"_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd",
                   "c10d::monitored_barrier_"}

if IMPORT_ERROR is None:
    class CommCounter(TorchDispatchMode):
        """Counts every collective operator dispatched while it is on, by stratbench's kinds;
        an operator of c10d's namespaces it does not know is an error (nothing is dropped)."""

        def __init__(self):
            super().__init__()
            self.counts = {}
            self.unknown = []
            self.paused = False

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            # A mode runs before a tensor subclass; returning NotImplemented for DTensor's
            # operators lets DTensor desugar them first, with this mode still on, so that the
            # collectives its redistributions issue come back here (as CommDebugMode does).
            # Otherwise they would run inside this handler, where the mode is off, uncounted.
            if any(getattr(t, "__name__", "") == "DTensor" for t in types_):
                return NotImplemented
            name = func._schema.name.replace("_c10d_functional_autograd::",
                                             "_c10d_functional::")
            if not self.paused and name.split("::")[0] in ("c10d", "_c10d_functional"):
                if name in COLLECTIVES:
                    kind, size = COLLECTIVES[name]
                    calls, nbytes = self.counts.get(kind, (0, 0))
                    self.counts[kind] = (calls + 1, nbytes + size(args))
                elif name not in NOT_COLLECTIVES:
                    self.unknown.append(name)
            return func(*args, **kwargs)

        @contextlib.contextmanager
        def pause(self):
            was, self.paused = self.paused, True
            try:
                yield
            finally:
                self.paused = was


def profiled_peak(prof):
    """The most the step's tensor allocations held above what was live when it began, from the
    profiler's memory events in time order; None where the profiler recorded no allocation (a
    step always allocates: its output, its gradients' temporaries; seen under load in CI: no
    event at all, or only frees)."""
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]"]
    if not any(n > 0 for _, n in events):
        return None
    events.sort(key=lambda e: e[0])
    current = peak = 0
    for _, n in events:
        current += n
        peak = max(peak, current)
    return peak


# ---- Placements -----------------------------------------------------------------------------
def strided(p):
    """DTensor's _StridedShard: FSDP2's shard of a tensor-parallel piece (not a Shard in
    PyTorch's class tree: is_shard() says False)."""
    return type(p).__name__ == "_StridedShard"


def sharded(p):
    """A shard placement: Shard or _StridedShard."""
    return p.is_shard() or strided(p)


def placement_text(p):
    if p.is_shard():
        if type(p).__name__ != "Shard":  # _StridedShard: not a torch.chunk piece
            raise ValueError(f"placement {p!r} is not one stratbench lays out")
        return f"Shard({p.dim})"
    if p.is_replicate():
        return "Replicate()"
    if p.is_partial():
        return "Partial(sum)"
    raise ValueError(f"placement {p!r} is not one stratbench lays out")


class Rank:
    moe = False  # a MoE layer (workload moe), set by prepare

    def __init__(self):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])

    # -- prepare ---------------------------------------------------------------------------
    def prepare(self, msg):
        from torch.distributed.device_mesh import init_device_mesh
        case = msg["case"]
        self.case = case
        self.moe = case["workload"] == "moe"
        tensors, _ = tensor_bundle.read(msg["bundle"])
        self.dtype = getattr(torch, case["dtype"])
        torch.manual_seed(case["seed"])
        # A runner the harness keeps between rows (its pool) meets its peers once.
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world)
        self.strategy = load_strategy(case)
        mesh_shape = tuple(case["mesh"])
        names = attr(self.strategy, "mesh_dim_names", None)
        if callable(names):  # names that depend on the case (a composition's params.axes)
            names = names(case)
        names = tuple(names or [f"dim{i}" for i in range(len(mesh_shape))])
        if len(names) != len(mesh_shape):
            return {"unsupported": f"the strategy names {len(names)} mesh axes {list(names)}, "
                                   f"the case's mesh has {len(mesh_shape)}"}
        self.mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        self.names = names
        batch_axes = attr(self.strategy, "batch_axes", ())
        self.batch_axes = tuple(batch_axes(names) if callable(batch_axes) else batch_axes)
        self.ctx = types.SimpleNamespace(
            mesh=self.mesh, case=case, params=case.get("params", {}), dtype=self.dtype,
            fault=case.get("fault") or None, world_size=self.world, rank=self.rank,
            batch_axes=self.batch_axes)
        applies = attr(self.strategy, "applies", None)
        why = applies(self.ctx) if applies else None
        # The batch is split over the batch axes in torch.chunk's pieces of equal rows.
        self.replicas = 1
        for a in self.batch_axes:
            self.replicas *= self.mesh.size(names.index(a))
        batch = tensors[case["data_inputs"][0]].shape[0] if case["data_inputs"] else 1
        if why is None and batch % self.replicas:
            why = (f"the batch's {batch} rows do not divide over the {self.replicas} ranks of "
                   f"the batch axes {list(self.batch_axes)}")
        if why:
            return {"unsupported": why}
        self.ctx.rows = batch // self.replicas  # a replica's rows of the batch
        if case["workload"] == "linear":
            self.op = DTensorLinear(tensors, self.mesh, case["placements"])
            return {"ok": True, "torch": torch.__version__}
        self.op = None

        model = build_model(case)
        model = model.to(self.dtype)
        own = dict(model.named_parameters())
        # The module's name of each of the reference's parameters: the same, or a MoE layer's
        # (REFERENCE_NAMES, by default torchtitan's; moe_layer.py).
        self.module_name = {n: n for n in case["parameters"]}
        if self.moe:
            self.module_name = dict(MOE_NAMES)
            self.module_name.update(getattr(model, "REFERENCE_NAMES", {}))
        self.reference_name = {m: r for r, m in self.module_name.items()}
        missing = [n for n in case["parameters"] if self.module_name[n] not in own]
        if missing:
            raise ValueError(f"the module built for {case['model_source']} has no parameter "
                             f"{self.module_name[missing[0]]} (the reference's {missing[0]}; "
                             f"it has {sorted(own)[:6]}...)")
        with torch.no_grad():
            for n in case["parameters"]:
                if own[self.module_name[n]].shape != tensors[n].shape:
                    raise ValueError(f"the module built for {case['model_source']} has "
                                     f"{self.module_name[n]} of shape "
                                     f"{list(own[self.module_name[n]].shape)}, the reference's "
                                     f"{n} {list(tensors[n].shape)}")
                own[self.module_name[n]].copy_(tensors[n])
            # Buffers the graph reads (rotary tables, masks, running statistics) as the
            # reference has them.
            for n, b in model.named_buffers():
                if n in tensors and tensors[n].shape == b.shape:
                    b.copy_(tensors[n])
        model.train()
        try:
            self.model = attr(self.strategy, "parallelize")(model, self.mesh, self.ctx) or model
        except Exception as e:
            if type(e).__name__ == "Unsupported":  # the strategy's own word: not this case
                return {"unsupported": str(e)}
            raise
        self.params = []
        for n, p in self.model.named_parameters():
            n = clean_name(n)
            self.params.append((self.reference_name.get(n, n), p))
        got = {n for n, _ in self.params}
        lost = [n for n in case["parameters"] if n not in got]
        # How many ranks hold a plain (not DTensor) parameter: every rank, unless the strategy
        # splits the model over the ranks (a pipeline's stages hold theirs only).
        # A composition's pipeline splits the parameters over its stages (param_split): a
        # DTensor on the mesh's other axes then has copies on world / (its mesh x the split)
        # ranks, a plain parameter on world / split.
        split = attr(self.strategy, "param_split", None)
        self.split = split(names, self.mesh) if split else 1
        self.plain_copies = (attr(self.strategy, "plain_param_copies", None) or
                             self.world // self.split)
        if lost and self.plain_copies == self.world:
            raise ValueError(f"after parallelize() the model has no parameter {lost[0]}")
        self.initial = [local(p).detach().clone() for _, p in self.params]
        self.own_step = attr(self.strategy, "forward_backward", None)
        index = 0
        for a in self.batch_axes:
            i = names.index(a)
            index = index * self.mesh.size(i) + self.mesh.get_local_rank(i)
        self.rows = lambda t: t.chunk(self.replicas, 0)[index] if self.replicas > 1 else t
        self.inputs = [self.rows(tensors[n]) for n in case["data_inputs"]]
        self.target = self.rows(tensors["target"] if "target" in tensors
                                else tensors["grad_output"])
        mean = attr(self.strategy, "gradient_mean", True)
        self.loss_scale = float(self.replicas) if mean and self.batch_axes else 1.0
        scale = attr(self.strategy, "loss_scale", None)
        custom = scale(self.ctx) if scale is not None else None
        if custom is not None:
            self.loss_scale = float(custom)
        return {"ok": True, "torch": torch.__version__}

    # -- step ------------------------------------------------------------------------------
    def make_optimizer(self):
        spec = self.case.get("optimizer") or {}
        params = [p for _, p in self.params]
        kind = spec.get("kind", "sgd")
        if kind == "sgd":
            return torch.optim.SGD(params, lr=spec.get("lr", 0.01),
                                   momentum=spec.get("momentum", 0.0),
                                   weight_decay=spec.get("weight_decay", 0.0), foreach=False)
        if kind == "adamw":
            betas = spec.get("betas", [0.9, 0.999])
            return torch.optim.AdamW(params, lr=spec.get("lr", 0.01), betas=tuple(betas),
                                     eps=spec.get("eps", 1e-8),
                                     weight_decay=spec.get("weight_decay", 0.0), foreach=False)
        raise ValueError(f"optimizer kind '{kind}' (expected sgd or adamw)")

    def norm_and_loss(self, loss_sum):
        """This step's loss over the whole batch and the global gradient norm, in float64:
        bookkeeping for the record (one all-reduce of two numbers), not the strategy's."""
        from torch.distributed.tensor import DTensor
        squares = torch.zeros((), dtype=torch.float64)
        for _, p in self.params:
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                if any(pl.is_partial() for pl in g.placements):
                    g = g.full_tensor()
                    squares += g.double().pow(2).sum() / (self.world // self.split)
                    continue
                copies = 1
                for i, pl in enumerate(g.placements):
                    if not sharded(pl):
                        copies *= g.device_mesh.size(i)
                copies *= self.world // (g.device_mesh.size() * self.split)
                squares += g.to_local().double().pow(2).sum() / copies
            else:
                squares += g.double().pow(2).sum() / self.plain_copies
        # The loss is summed over the batch axes' ranks; the others hold copies of it (a
        # strategy that runs the step itself returns each rank's part of the sum).
        share = loss_sum if self.own_step else loss_sum * self.replicas / self.world
        both = torch.stack([share, squares])
        dist.all_reduce(both)
        return both[0].item(), both[1].sqrt().item()

    def run(self, counter=None):
        if self.op is not None:
            self.op.step()
            return
        training = self.case["steps"] > 0
        pause = counter.pause if counter else contextlib.nullcontext
        with torch.no_grad():
            for (_, p), init in zip(self.params, self.initial):
                local(p).copy_(init)
                p.grad = None
        opt = self.make_optimizer() if training else None
        self.opt = opt
        losses, norms = [], []
        clip = (self.case.get("optimizer") or {}).get("clip_grad_norm", 0.0)
        clip_fn = attr(self.strategy, "clip_grad_norm", None)
        for k in range(max(1, self.case["steps"])):
            if opt:
                for group in opt.param_groups:
                    group["lr"] = self.case["lrs"][k]
            if self.case.get("draw_seeds"):
                # A model that draws random numbers (dropout): the generator at the step's seed,
                # as the reference sets LibTorch's before its forward (drawSeed).
                torch.manual_seed(self.case["draw_seeds"][k])
            if self.own_step:
                # The strategy runs the forward and backward (a pipeline's schedule).
                out = None
                loss = self.own_step(self.model, self.inputs, self.target, self.ctx)
            elif self.moe:
                out, loss = self.moe_step(k)
            else:
                out = self.model(*self.inputs)
                while isinstance(out, (tuple, list)):
                    out = out[0]
                out_local = local(out)
                loss = (out_local * self.target).sum()
                (loss * self.loss_scale if self.loss_scale != 1.0 else loss).backward()
            with pause(), torch.no_grad():
                l, n = self.norm_and_loss(loss.detach().double())
            losses.append(l)
            norms.append(n)
            if training:
                if clip > 0 and clip_fn is not None:
                    # The strategy clips as its training loop does (torchtitan's over a
                    # pipeline's stages); the norm recorded stays the runner's own.
                    clip_fn([p for _, p in self.params], clip, self.ctx)
                elif clip > 0:
                    coef = clip / (n + 1e-6)
                    if coef < 1:
                        with torch.no_grad():
                            for _, p in self.params:
                                if p.grad is not None:
                                    p.grad.mul_(coef)
                opt.step()
                opt.zero_grad(set_to_none=False)
        self.output = out
        self.losses, self.norms = losses, norms

    def moe_step(self, k):
        """One forward and backward of a MoE layer on the rank's tokens: the loss
        sum(output x target) + aux_coef x the rank's share of the load-balancing loss, the
        input's gradient kept, the strategy's reductions after the backward (reduce_gradients),
        the layer's routing kept per step."""
        x = self.inputs[0].detach().clone().requires_grad_(True)
        out, aux = self.model(x)
        loss = (local(out) * self.target).sum() + self.case["shape"].get("aux_coef", 0.01) * aux
        (loss * self.loss_scale if self.loss_scale != 1.0 else loss).backward()
        reduce = attr(self.strategy, "reduce_gradients", None)
        if reduce is not None:
            reduce(self.model, self.ctx)
        routing = getattr(self.model, "routing", None) or {}
        missing = [n for n in ("expert_index", "kept", "tokens_per_expert") if n not in routing]
        if missing:
            raise ValueError(f"the MoE layer set no routing['{missing[0]}'] in its forward "
                             f"(moe_layer.py says what torch/ep reads)")
        if k == 0:
            self.routing = []
        self.routing.append({n: t.detach().clone() for n, t in routing.items()})
        self.aux, self.grad_input = aux.detach(), x.grad
        return out, loss

    def step(self, msg):
        if not msg.get("measure"):
            start = time.perf_counter()
            self.run()
            return {"ok": True, "seconds": time.perf_counter() - start}
        from torch.profiler import ProfilerActivity, profile
        # Now and then (under load, seen in CI) the profiler hands back no allocation event for a
        # step that allocated: that step is measured again, up to twice, rather than reported as
        # allocating nothing.
        for attempt in range(3):
            counter = CommCounter()
            if self.op is not None:
                self.op.reset()
            start_bytes = self.live_bytes()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                start = time.perf_counter()
                with counter:
                    self.run(counter)
                seconds = time.perf_counter() - start
            peak = profiled_peak(prof)
            if peak is not None:
                break
        if peak is None:
            raise RuntimeError("the profiler recorded no allocation in 3 measured steps")
        if counter.unknown:
            raise RuntimeError(f"the step ran collective operator(s) {sorted(set(counter.unknown))}"
                               f" that the counter does not know how to count")
        return {"ok": True, "seconds": seconds, "comm": counter.counts,
                "peak_bytes": start_bytes + peak, "start_bytes": start_bytes,
                "measure_attempts": attempt + 1}

    def live_bytes(self):
        """The bytes of what a step starts from: parameters, gradients, optimizer state, buffers
        and the rank's inputs (each storage once)."""
        seen, total = set(), 0
        if self.op is not None:
            return sum(local(t).untyped_storage().nbytes() for t in self.op.leaves())

        def add(t):
            nonlocal total
            if isinstance(t, torch.Tensor):
                t = local(t)
                s = t.untyped_storage()
                if s.data_ptr() not in seen and s.nbytes():
                    seen.add(s.data_ptr())
                    total += s.nbytes()
        for _, p in self.params:
            add(p)
            add(p.grad)
        for b in self.model.buffers():
            add(b)
        for t in self.inputs + [self.target]:
            add(t)
        opt = getattr(self, "opt", None)
        if opt is not None:
            for st in opt.state.values():
                for v in st.values():
                    add(v)
        return total

    # -- results ---------------------------------------------------------------------------
    def full_placements(self, t):
        """`t`'s placement on every axis of the case's mesh."""
        from torch.distributed.tensor import DTensor
        out = ["Replicate()"] * len(self.names)
        if not isinstance(t, DTensor):
            return out
        sub = t.device_mesh.mesh_dim_names
        if t.device_mesh.ndim == len(self.names) and sub in (None, self.names):
            return [placement_text(p) for p in t.placements]
        if not sub or any(n not in self.names for n in sub):
            raise ValueError(f"a DTensor on mesh {t.device_mesh} whose axes are not named after "
                             f"the case's mesh axes {list(self.names)}")
        for n, p in zip(sub, t.placements):
            out[self.names.index(n)] = placement_text(p)
        return out

    def layout_of(self, t):
        """`t`'s layout on the case's mesh: its placement per axis, or, where a dimension is
        sharded over several axes out of mesh order (FSDP2 over a tensor-parallel weight:
        DTensor's _StridedShard on the data-parallel axis, whose piece is cut from the tp
        axis's piece), ColossalAI's sequence naming each dimension's axes outermost first
        ("[S20, R]"), which placement.h reads."""
        from torch.distributed.tensor import DTensor
        if not isinstance(t, DTensor) or not any(strided(p) for p in t.placements):
            return self.full_placements(t)
        view = self.split_view(t)
        if view is not None:
            return view
        sub = t.device_mesh.mesh_dim_names
        if not sub or any(n not in self.names for n in sub):
            raise ValueError(f"a DTensor on mesh {t.device_mesh} whose axes are not named after "
                             f"the case's mesh axes {list(self.names)}")
        axis = [self.names.index(n) for n in sub]
        dims = [[] for _ in range(t.ndim)]
        for d in range(t.ndim):
            entries = [(i, p) for i, p in enumerate(t.placements) if sharded(p) and p.dim == d]
            order = [i for i, _ in entries]
            for i, p in entries:
                sf = getattr(p, "split_factor", 1)
                if not strided(p) or sf == 1:
                    continue
                # The axes after i that shard d first, their sizes multiplying to the split
                # factor, are outer to i.
                later, prod = [], 1
                for j, _ in entries:
                    if j > i and prod < sf:
                        later.append(j)
                        prod *= t.device_mesh.size(j)
                if prod != sf:
                    raise ValueError(f"placement {p!r} on mesh {t.device_mesh}: no later axes "
                                     f"of dimension {d} make its split factor {sf}")
                order.remove(i)
                order.insert(order.index(later[-1]) + 1, i)
            dims[d] = [axis[i] for i in order]
        if any(p.is_partial() for p in t.placements):
            raise ValueError(f"placements {t.placements}: pending sums beside a strided shard")
        return "[" + ", ".join("S" + "".join(str(a) for a in axes) if axes else "R"
                               for axes in dims) + "]"

    def split_view(self, t):
        """A strided shard whose split factor no other axis makes (a fused projection's rows of
        each of its parts: GPT-2's qkv under _StridedShard(0, split_factor=3), a rank's rows of
        q, of k and of v) as one shard of a view that splits the dimension into the factor and
        the rest: {view, placements} (Shard(1) of [3, D, D]), the local tensor as DTensor holds
        it. None where the tensor is not such a one."""
        entries = [(i, p) for i, p in enumerate(t.placements)
                   if strided(p) and getattr(p, "split_factor", 1) > 1]
        if len(entries) != 1:
            return None
        i, p = entries[0]
        d = p.dim % t.ndim
        if any(sharded(q) and q.dim % t.ndim == d for j, q in enumerate(t.placements) if j != i):
            return None
        n, sf = t.shape[d], p.split_factor
        if n % sf:
            raise ValueError(f"placement {p!r}: dimension {d} of {tuple(t.shape)} is not "
                             f"{sf} equal parts")
        sub = t.device_mesh.mesh_dim_names
        if t.device_mesh.ndim != len(self.names) or sub not in (None, self.names):
            raise ValueError(f"a strided shard on mesh {t.device_mesh} whose axes are not the "
                             f"case's mesh axes {list(self.names)}")
        out = []
        for j, q in enumerate(t.placements):
            if j == i:
                out.append(f"Shard({d + 1})")
            elif q.is_shard():
                e = q.dim % t.ndim
                out.append(f"Shard({e + 1 if e > d else e})")
            else:
                out.append(placement_text(q))
        shape = list(t.shape)
        return {"view": shape[:d] + [sf, n // sf] + shape[d + 1:], "placements": out}

    def results(self, msg):
        tensors, placements = {}, {}

        def put(name, t, where):
            tensors[name] = local(t).detach()
            placements[name] = where

        replicated = ["Replicate()"] * len(self.names)
        if self.moe:
            self.moe_results(put, replicated)
        if self.op is not None:
            for name, t in self.op.results().items():
                if self.ctx.fault == "partial_reported_whole" and hasattr(t, "placements"):
                    # Planted: pending sums handed back as if reduced (a rank's part as the
                    # whole), the mistake of a to_local() that forgets a Partial placement.
                    put(name, t, [placement_text(p) if not p.is_partial() else "Replicate()"
                                  for p in t.placements])
                    continue
                t = settled(t)
                put(name, t, self.full_placements(t))
        elif self.case["steps"] > 0:
            put("loss", torch.tensor(self.losses, dtype=torch.float64), replicated)
            put("grad_norm", torch.tensor(self.norms, dtype=torch.float64), replicated)
            step = None
            for name, p in self.params:
                put("param/" + name, p, self.layout_of(p))
                for key, v in self.opt.state.get(p, {}).items():
                    if key == "step":
                        step = float(v)
                    elif isinstance(v, torch.Tensor):
                        put(f"state/{name}/{key}", v, self.layout_of(v))
            if step is not None:
                put("state/step", torch.tensor([step], dtype=torch.float64), replicated)
        elif self.moe:
            for name, p in self.params:
                if p.grad is not None:
                    put("grad_" + name, p.grad, self.layout_of(p.grad))
        else:
            out = settled(self.output)
            where = self.full_placements(out)
            if self.replicas > 1 and not hasattr(out, "placements"):
                where = list(where)
                for a in self.batch_axes:
                    # The rows of a batch split over several axes nest in axis order.
                    i = self.names.index(a)
                    where[i] = "Shard(0)"
            put("output", out, where)
            for name, p in self.params:
                if p.grad is not None:
                    g = settled(p.grad)
                    put("grad/" + name, g, self.layout_of(g))
        tensor_bundle.write(msg["path"], tensors, {"placements": json.dumps(placements)})
        return {"ok": True}


    def rows_layout(self, dim):
        """Where a tensor of the rank's tokens lies: its dimension `dim` split over the batch
        axes, nested in axis order."""
        where = ["Replicate()"] * len(self.names)
        for a in self.batch_axes:
            where[self.names.index(a)] = f"Shard({dim})"
        return where

    def moe_results(self, put, replicated):
        """A MoE layer's own results: its routing (every step's, stacked, over steps), the
        load-balancing loss and, for one step, the output and the input's gradient; the counts
        per expert and the loss summed over the ranks' tokens."""
        training = self.case["steps"] > 0
        for name in ("expert_index", "kept", "tokens_per_expert"):
            per_step = [r[name].double().clone() for r in self.routing]
            if name == "tokens_per_expert":
                # Summed as float64 (exact counts in any dtype), on copies: results() may be
                # asked again.
                for t in per_step:
                    dist.all_reduce(t)
            t = (torch.stack(per_step) if training else per_step[0]).to(self.dtype)
            put(name, t, replicated if name == "tokens_per_expert" else
                self.rows_layout(1 if training else 0))
        if not training:
            aux = self.aux.reshape(1).clone()
            dist.all_reduce(aux)
            put("aux_loss", aux, replicated)
            put("output", local(self.output), self.rows_layout(0))
            put("grad_input", self.grad_input, self.rows_layout(0))


def settled(t):
    """`t` with its pending sums (a Partial placement DTensor keeps until it is used) reduced,
    as the harness's settle() promises its results."""
    if hasattr(t, "placements") and any(p.is_partial() for p in t.placements):
        from torch.distributed.tensor import Replicate
        return t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p
                                              for p in t.placements])
    return t


def parse_placements(texts):
    """DTensor placements from their spelling: "Shard(0)", "Replicate()", "Partial(sum)"."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    out = []
    for t in texts:
        if t.startswith("Shard("):
            out.append(Shard(int(t[6:-1])))
        elif t == "Replicate()":
            out.append(Replicate())
        elif t.startswith("Partial"):
            out.append(Partial())
        else:
            raise ValueError(f"placement '{t}'")
    return out


def place(full, mesh, placements):
    """`full` as a DTensor with `placements`: shards as DTensor cuts them; pending sums held
    whole by the ranks at coordinate 0 of the partial axes and as zeros by the others (their
    sum is `full`, exactly)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    plain = [Replicate() if p.is_partial() else p for p in placements]
    local_ = distribute_tensor(full, mesh, plain).to_local().clone()
    if any(mesh.get_local_rank(i) != 0 for i, p in enumerate(placements) if p.is_partial()):
        local_.zero_()
    return DTensor.from_local(local_, mesh, placements, run_check=False, shape=full.shape,
                              stride=full.stride())


class DTensorLinear:
    """DTensor's own F.linear on inputs laid out as the case says (workload linear): its forward
    and its backward by DTensor's sharding propagation and redistribution, the gradient of the
    output laid out as the output is (its pending sums' dual: replicated)."""

    def __init__(self, tensors, mesh, placements):
        self.x = place(tensors["input"], mesh, parse_placements(placements["input"]))
        self.w = place(tensors["weight"], mesh, parse_placements(placements["weight"]))
        self.b = (place(tensors["bias"], mesh, parse_placements(placements["bias"]))
                  if "bias" in tensors and "bias" in placements else None)
        for t in self.leaves():
            t.requires_grad_(True)
        with torch.no_grad():
            out = torch.nn.functional.linear(self.x, self.w, self.b)
        from torch.distributed.tensor import Replicate, distribute_tensor
        self.grad_output = distribute_tensor(
            tensors["grad_output"], mesh,
            [Replicate() if p.is_partial() else p for p in out.placements])

    def leaves(self):
        return [t for t in (self.x, self.w, self.b) if t is not None]

    def reset(self):
        """Drops the last step's gradients and output, before a step and before what a measured
        step starts from is counted (live_bytes counts the operands only): otherwise the step's
        first events free them and its allocations can fit in what they freed."""
        for t in self.leaves():
            t.grad = None
        self.out = None

    def step(self):
        self.reset()
        self.out = torch.nn.functional.linear(self.x, self.w, self.b)
        self.out.backward(self.grad_output)

    def results(self):
        out = {"output": self.out.detach(), "grad_input": self.x.grad,
               "grad_weight": self.w.grad}
        if self.b is not None:
            out["grad_bias"] = self.b.grad
        return out


def attr(strategy, name, default=None):
    """A strategy's attribute as a module (UPPER_CASE constants, functions) or an object."""
    for n in (name, name.upper()):
        if hasattr(strategy, n):
            return getattr(strategy, n)
    if default is None and name == "parallelize":
        raise AttributeError("the strategy has no parallelize(model, mesh, ctx)")
    return default


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def clean_name(name):
    """A parameter's name as the model had it, without the wrappers' prefixes."""
    for token in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(token, "")
    return name[len("module."):] if name.startswith("module.") else name


def import_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise FileNotFoundError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_strategy(case):
    if case.get("strategy_file"):
        return import_file(case["strategy_file"], "sb_user_strategy")
    import builtin_strategies
    return builtin_strategies.STRATEGIES[case["strategy"]]


def build_model(case):
    """The Python module the case's model was traced from: `source:name`, where the file
    defines build_model(name) or a callable `name` returning the nn.Module; or a torch.export
    archive (`file.pt2`): the exported program itself, unflattened into its modules
    (torch.export.unflatten), so that a strategy wraps its blocks as it wraps the model's."""
    if case["workload"] == "moe":
        # A MoE layer: a callable taking the case's shape (moe_layer.py).
        source, _, name = case["model_source"].rpartition(":")
        module = import_file(source, "sb_user_model")
        if not callable(getattr(module, name, None)):
            raise ValueError(f"{source} has no callable '{name}' (a MoE layer taking the case's "
                             f"shape)")
        return getattr(module, name)(case["shape"])
    if case["model_source"].endswith(".pt2"):
        return torch.export.unflatten(torch.export.load(case["model_source"]))
    source, _, name = case["model_source"].rpartition(":")
    module = import_file(source, "sb_user_model")
    if hasattr(module, "build_model"):
        return module.build_model(name)
    if not hasattr(module, name):
        raise ValueError(f"{source} has neither build_model(name) nor a callable '{name}'")
    return getattr(module, name)()


# The reference moe workload's parameters as torchtitan's MoE names them (moe_layer.py).
MOE_NAMES = {"router": "router.gate.weight", "w1": "experts.w1", "w3": "experts.w3",
             "w2": "experts.w2"}


def main():
    reply = reply_channel()

    def send(obj):
        reply.write(json.dumps(obj) + "\n")
        reply.flush()
    rank = None
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "exit":
            break
        if IMPORT_ERROR is not None:
            send({"unsupported": f"{sys.executable} cannot import torch's distributed pieces "
                                 f"({IMPORT_ERROR})"})
            continue
        try:
            if cmd == "prepare":
                rank = None  # the last row's model, strategy and optimizer go first
                gc.collect()
                rank = Rank()
                send(rank.prepare(msg))
            elif cmd == "step":
                send(rank.step(msg))
            elif cmd == "results":
                send(rank.results(msg))
            else:
                send({"error": f"unknown command '{cmd}'"})
        except Exception as e:
            traceback.print_exc()
            send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    if IMPORT_ERROR is None and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
