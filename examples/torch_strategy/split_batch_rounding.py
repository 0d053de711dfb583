"""Why a data-parallel row needs the split-sum tolerance, with no parallelism at all.

GPT-2 (reference/models/trace_models.py) trained 3 SGD-momentum steps on its whole batch, and
on the same batch summed in two halves (what two data-parallel ranks and their all-reduce do),
in one process: the momentum buffers after the last step, over float32's default tolerance
(atol 1e-5, rtol 1.3e-6). docs/measurements.md quotes the numbers.

    ~/.cache/stratbench/torch2.13/bin/python examples/torch_strategy/split_batch_rounding.py
"""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../reference/models"))
import trace_models  # noqa: E402

torch.manual_seed(0)
model = trace_models.build_model("gpt2")
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 64, (4, 16), generator=g)
target = torch.randn(4, 16, 64, generator=g)


def train(parts):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, foreach=False)
    for _ in range(3):
        opt.zero_grad()
        for x, t in zip(ids.chunk(parts), target.chunk(parts)):
            (m(x) * t).sum().backward()
        opt.step()
    return {n: opt.state[p]["momentum_buffer"] for n, p in m.named_parameters()}


whole, halves = train(1), train(2)
for name in list(whole)[:8]:
    tol = 1e-5 + 1.3e-6 * whole[name].abs()
    print(f"{name:28s} worst |whole - halves| / tolerance = "
          f"{((whole[name] - halves[name]).abs() / tol).max().item():.2f}")
