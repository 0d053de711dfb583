// The LibTorch headers every translation unit here uses, precompiled once (see CMakeLists.txt).
// Deliberately not <torch/torch.h>: its nn/optim/data headers double the parse time.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
