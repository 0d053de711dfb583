#include "reference/tensor_bundle.h"

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/json_strict.h"

namespace sb::reference {
namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return table;
}

}  // namespace

void writeBundle(const std::string& path, const TensorBundle& b) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> dense;
  int64_t offset = 0;
  for (const auto& [name, t] : b.tensors) {
    std::string code;
    for (const auto& [c, st] : dtypes()) {
      if (st == t.scalar_type()) code = c;
    }
    if (code.empty()) {
      throw std::runtime_error(path + ": tensor '" + name + "' has dtype " +
                               std::string(c10::toString(t.scalar_type())) +
                               ", which a bundle cannot hold");
    }
    const at::Tensor d = t.detach().to(at::kCPU).contiguous();
    const int64_t n = d.numel() * static_cast<int64_t>(d.element_size());
    header[name] = {
        {"dtype", code}, {"shape", d.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    dense.push_back(d);
    offset += n;
  }
  if (!b.metadata.empty()) header["__metadata__"] = b.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t len = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(le), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& d : dense) {
    out.write(static_cast<const char*>(d.data_ptr()),
              static_cast<std::streamsize>(d.numel() * d.element_size()));
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

TensorBundle readBundle(const std::string& path) {
  // A regular file only: a FIFO blocks the reader and /dev/zero is read until memory runs out.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    throw std::runtime_error(path +
                             ": not a regular file (a folder, a FIFO or a device); a "
                             "tensor bundle is a file trace_models.py or stratbench wrote");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bad = [&](const std::string& what) {
    return std::runtime_error(path + ": not a tensor bundle: " + what);
  };
  if (data.size() < 8) throw bad(std::to_string(data.size()) + " bytes");
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(data[i]);
  if (len > data.size() - 8) throw bad("a header of " + std::to_string(len) + " bytes");
  nlohmann::json header;
  try {
    // A tensor named twice would be the last one's bytes under either's name.
    header = parseJsonNoDuplicates(data.substr(8, len));
  } catch (const std::invalid_argument& e) {
    throw bad(std::string("its header's ") + e.what());
  } catch (const std::exception& e) {
    throw bad(std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw bad("its header is not a JSON object");
  const uint64_t base = 8 + len;
  TensorBundle b;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) throw bad("metadata '" + k + "' is not a string");
        b.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      const std::string code = e.at("dtype").get<std::string>();
      at::ScalarType st = at::kFloat;
      bool known = false;
      for (const auto& [c, s] : dtypes()) {
        if (c == code) {
          st = s;
          known = true;
        }
      }
      if (!known) throw bad("tensor '" + name + "' has dtype '" + code + "'");
      const auto shape = e.at("shape").get<std::vector<int64_t>>();
      const auto range = e.at("data_offsets").get<std::vector<uint64_t>>();
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
      const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
      if (range.size() != 2 || range[1] < range[0] || range[1] - range[0] != n ||
          base + range[1] > data.size()) {
        throw bad("tensor '" + name + "''s byte range does not hold its shape and dtype");
      }
      if (n) std::memcpy(t.data_ptr(), data.data() + base + range[0], n);
      b.tensors[name] = t;
    } catch (const nlohmann::json::exception& x) {
      throw bad("tensor '" + name + "': " + x.what());
    }
  }
  return b;
}

}  // namespace sb::reference
