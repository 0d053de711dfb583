// libFuzzer target: the torch.export reader (reference/torchscript/export.h: a .pt2 archive's
// program and weights config, `workload: torchscript` with a .pt2 file, `graph --model`). The
// input is the weights config's JSON, a NUL byte, then the program's JSON (models/model.json);
// the target writes them with LibTorch's own zip writer into an archive beside one weight record
// of 64 bytes and reads it back. Any input is a module or an ImportError naming the file and
// what is wrong; nothing else may escape (a c10::Error from LibTorch, a JSON exception), and a
// module it returns has a forward.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <caffe2/serialize/inline_container.h>

#include "reference/torchscript/export.h"
#include "reference/torchscript/import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) return 0;
  const std::string config = in.substr(0, nul), program = in.substr(nul + 1);
  static const std::string file = "/tmp/sb_pt2_fuzz_" + std::to_string(::getpid()) + ".pt2";
  {
    caffe2::serialize::PyTorchStreamWriter w(file);
    const std::string weight(64, '\x01');
    w.writeRecord("archive_format", "pt2", 3);
    w.writeRecord("byteorder", "little", 6);
    w.writeRecord("models/model.json", program.data(), program.size());
    w.writeRecord("data/weights/model_weights_config.json", config.data(), config.size());
    w.writeRecord("data/weights/weight_0", weight.data(), weight.size());
    w.writeEndOfFile();
  }
  try {
    const auto m = sb::reference::torchscript::loadModelFile(file);
    if (!m.exported || !m.module.find_method("forward")) __builtin_trap();
  } catch (const sb::reference::torchscript::ImportError& e) {
    if (std::string(e.what()).find(file) == std::string::npos) __builtin_trap();  // names the file
  }
  return 0;
}
