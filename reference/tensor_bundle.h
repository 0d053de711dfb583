#pragma once

// Tensor bundles: the files the harness and a PyTorch rank hand tensors over in. The format is
// safetensors' (8 bytes of little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the bytes), so that any tool reads them; the Python side is
// reference/tensor_bundle.py. The header's "__metadata__" holds strings only.

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace sb::reference {

struct TensorBundle {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes `b` to `path` (tensors of any device and layout, copied to dense CPU memory). Throws
// std::runtime_error naming the path or the tensor whose dtype a bundle cannot hold.
void writeBundle(const std::string& path, const TensorBundle& b);
// Reads the bundle at `path`. Throws std::runtime_error naming the path and what is malformed
// (a header that is not JSON, a dtype it does not know, a byte range outside the file).
TensorBundle readBundle(const std::string& path);

}  // namespace sb::reference
