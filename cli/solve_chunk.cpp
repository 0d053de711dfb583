// `stratbench solve chunk`: a chunk plan for a transformer workload under an activation-memory
// limit (strategies/chunking/estimator.h). One subcommand per file (cli/commands.h).

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/case.h"
#include "harness/error.h"
#include "harness/run/run_util.h"
#include "reference/transformer.h"
#include "strategies/chunking/estimator.h"

namespace {

using sb::cli::kExitBadInput;

// `solve chunk`: the search's plan as JSON; exit 1 when none fits, 2 on a bad shape.
int solveChunk(const std::string& workload, const std::string& shapeText, double maxMemory,
               const std::string& dtypeName) {
  namespace ch = sb::strategies::chunking;
  if (workload != "gpt2_prefill" && workload != "vit_encoder") {
    std::cerr << "stratbench solve: --workload '" << workload
              << "' is not one the chunk search knows (gpt2_prefill, vit_encoder)\n";
    return kExitBadInput;
  }
  sb::reference::TransformerShape shape;
  at::ScalarType dtype;
  try {
    shape = sb::reference::TransformerShape::parse(nlohmann::json::parse(shapeText), workload);
    dtype = sb::harness::parseDtype(dtypeName);
  } catch (const nlohmann::json::parse_error& e) {
    std::cerr << "stratbench solve: --shape is not valid JSON: " << sb::harness::errorText(e)
              << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "stratbench solve: --shape: " << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  ch::ChunkSearch r;
  try {
    r = ch::searchChunkPlan(shape, c10::elementSize(dtype), static_cast<int64_t>(maxMemory));
  } catch (const sb::harness::InputError& e) {
    std::cerr << "stratbench solve: --shape: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  if (!r.plan) {
    std::cerr << "stratbench solve: no chunk plan of " << workload << " (" << shape.toString()
              << ") fits --max-memory " << static_cast<int64_t>(maxMemory)
              << " bytes; the smallest of " << r.plansTried << " plans needs " << r.smallest
              << " (unchunked " << r.unchunked << ")\n";
    return 1;
  }
  nlohmann::json j;
  j["workload"] = workload;
  j["shape"] = shape.toString();
  j["max_memory"] = static_cast<int64_t>(maxMemory);
  j["plan"] = {{"region", r.plan->region},
               {"dim", "seq"},
               {"chunk", r.plan->chunk},
               {"chunks", (shape.seq + r.plan->chunk - 1) / r.plan->chunk}};
  j["estimated_activation_peak_bytes"] = r.estimate;
  j["unchunked_estimate_bytes"] = r.unchunked;
  j["plans_tried"] = r.plansTried;
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

namespace sb::cli {

Command addSolveChunk(CLI::App& solve) {
  struct Args {
    std::string chunkWorkload = "gpt2_prefill", chunkShape, chunkDtype = "float32";
    double maxMemory = 0;
  };
  const auto a = std::make_shared<Args>();
  auto* chunkCmd = solve.add_subcommand(
      "chunk", "A chunk plan for a transformer workload under an activation-memory limit");
  chunkCmd->add_option("--workload", a->chunkWorkload, "gpt2_prefill or vit_encoder")
      ->capture_default_str();
  chunkCmd->add_option("--shape", a->chunkShape, "JSON, e.g. '{\"seq\": 1024, \"d_model\": 64}'")
      ->required();
  chunkCmd->add_option("--max-memory", a->maxMemory, "Activation memory limit in bytes")
      ->required()
      ->check(sb::cli::byteCount(1));
  chunkCmd->add_option("--dtype", a->chunkDtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();
  return {chunkCmd,
          [a] { return solveChunk(a->chunkWorkload, a->chunkShape, a->maxMemory, a->chunkDtype); }};
}

}  // namespace sb::cli
