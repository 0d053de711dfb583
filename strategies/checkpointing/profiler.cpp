#include "strategies/checkpointing/profiler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>

#include "harness/measure/device.h"
#include "harness/measure/memory.h"
#include "reference/autograd_engine.h"

namespace sb::strategies::checkpointing {
namespace {

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double bytes(const at::Tensor& t) { return static_cast<double>(t.nbytes()); }

}  // namespace

at::Tensor tapeInput(const at::Tensor& x) {
  at::Tensor t = x.detach();
  return t.is_floating_point() || t.is_complex() ? t.requires_grad_(true) : t;
}

Chain profileChain(const reference::ChainNet& net, int rank, int repetitions) {
  auto& mem = harness::MemoryTracker::instance();
  TORCH_INTERNAL_ASSERT(mem.installed(), "profileChain needs the tracking allocator");
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rngState = gen.get_state();
  net.zeroGrad();  // backward accumulates in place: no gradient allocation in the numbers

  const int L = net.numStages();
  Chain c;
  // x[0] of ids (an imported transformer's tokens) is held by the caller and takes no gradient:
  // the chain neither holds it nor writes a d[0] of it.
  c.x.push_back(tapeInput(net.input()).requires_grad() ? bytes(net.input()) : 0.0);
  c.xbar.push_back(c.x.back());
  at::Tensor x = net.input().detach();
  for (int i = 0; i < L; ++i) {
    std::vector<double> ft, bt;
    double xbar = 0, fetmp = 0, ftmp = 0, btmp = 0, xout = 0;
    for (int r = 0; r < std::max(1, repetitions); ++r) {
      // Fe_i: what a taped forward leaves alive (output and saved tensors) and its transient.
      const int64_t before = mem.current(rank);
      mem.resetPeak(rank);
      const at::Tensor in = tapeInput(x);
      harness::StepTimer timer;  // CUDA events on a GPU: the work, not its launch
      timer.start();
      at::Tensor out = net.stage(i, in, false);
      ft.push_back(timer.stopSeconds() * 1e6);
      const int64_t after = mem.current(rank);
      xbar = std::max(xbar, static_cast<double>(after - before));
      fetmp = std::max(fetmp, static_cast<double>(mem.peak(rank) - after));
      xout = bytes(out);

      // Fn_i: the same forward without a tape may need other temporaries.
      {
        c10::NoGradGuard noGrad;
        mem.resetPeak(rank);
        at::Tensor o = net.stage(i, x, false);
        ftmp = std::max(ftmp, static_cast<double>(mem.peak(rank) - mem.current(rank)));
      }

      // B_i: from d[i+1] (ones) to d[i]; its transient above what it holds and writes.
      const at::Tensor d = at::ones_like(out);
      const int64_t b3 = mem.current(rank);
      mem.resetPeak(rank);
      timer.start();
      reference::backward({out}, {d});
      bt.push_back(timer.stopSeconds() * 1e6);
      btmp = std::max(
          btmp, static_cast<double>(mem.peak(rank) - b3) - (in.requires_grad() ? bytes(in) : 0.0));
      out = at::Tensor();
    }
    {
      c10::NoGradGuard noGrad;
      x = net.stage(i, x, false);
    }
    c.ftime.push_back(medianOf(ft));
    c.btime.push_back(medianOf(bt));
    c.x.push_back(xout);
    c.xbar.push_back(std::max(xbar, xout));
    c.ftmp.push_back(ftmp);
    c.fetmp.push_back(fetmp);
    c.btmp.push_back(std::max(0.0, btmp));
  }
  // The loss, sum(y * target): forward and backward to d[L], as the executor's step runs it
  // (the loss in a statement of its own, so that the product is freed before the backward).
  std::vector<double> lt;
  double ltmp = 0, lossBytes = 0;
  for (int r = 0; r < std::max(1, repetitions); ++r) {
    const at::Tensor y = x.detach().requires_grad_(true);
    const int64_t before = mem.current(rank);
    mem.resetPeak(rank);
    harness::StepTimer timer;
    timer.start();
    const at::Tensor loss = (y * net.target()).sum();
    reference::backward({loss});
    lt.push_back(timer.stopSeconds() * 1e6);
    ltmp = std::max(ltmp, static_cast<double>(mem.peak(rank) - before) - bytes(y));
    lossBytes = 2 * bytes(loss);  // the loss and the gradient its backward is seeded with
  }
  c.btime.push_back(medianOf(lt));
  c.btmp.push_back(std::max(0.0, ltmp));
  // The executor's step keeps its output and loss, and runs the chain as one autograd node.
  c.outputKept = true;
  c.lossBytes = lossBytes;
  c.lossGradKept = true;
  net.zeroGrad();
  gen.set_state(rngState);
  c.validate("profile");
  return c;
}

}  // namespace sb::strategies::checkpointing
