// `stratbench calibrate`: latency and bandwidth of each collective per mesh axis, and matmul
// throughput, into a cost profile (harness/dist/calibrate.h). One subcommand per file
// (cli/commands.h).

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/comm/c10d_backend.h"
#include "harness/comm/threads_backend.h"
#include "harness/dist/calibrate.h"
#include "harness/dist/dist_env.h"
#include "harness/error.h"
#include "harness/out_file.h"
#include "harness/run/run_util.h"

namespace {

using sb::cli::kExitBadInput;

// The threads backend runs a thread per rank in this process: as many as a suite's mesh may have.
constexpr int64_t kMaxThreadRanks = 64;

// `stratbench calibrate`: on threads in this process, or on a c10d backend as one rank of a
// launched run; rank 0 writes the profile.
int calibrateMain(const std::string& backend, const std::string& meshText,
                  const std::string& outPath, int64_t maxBytes) {
  using namespace sb::harness;
  std::vector<int64_t> shape;
  try {
    shape = DeviceMesh::parseShape(meshText,
                                   backend == "threads" ? kMaxThreadRanks : DeviceMesh::kMaxRanks);
  } catch (const c10::Error& e) {
    throw InputError(std::string("--mesh: ") + e.what_without_backtrace() +
                     (backend == "threads" ? " (the threads backend runs a thread per rank)" : ""));
  }
  DeviceMesh mesh(shape);
  CalibrateOptions co;
  co.sizes.erase(
      std::remove_if(co.sizes.begin(), co.sizes.end(), [&](int64_t s) { return s > maxBytes; }),
      co.sizes.end());
  CostProfile profile;
  bool writer = true;
  if (backend == "threads") {
    checkResultPath(outPath);  // refused before minutes of measuring, not after
    ThreadsWorld world(mesh);
    profile = calibrate(world, co, std::cout);
  } else {
    const DistEnv env = detectDistEnv();
    std::signal(SIGPIPE, SIG_IGN);
    Session session(env, backend, std::chrono::minutes(5));
    World* world = session.world(mesh);
    if (!world) return 0;  // this rank is outside the mesh
    writer = session.rank() == 0;
    std::ostringstream quiet;
    profile = calibrate(*world, co, writer ? std::cout : quiet);
  }
  if (!writer) return 0;
  replaceResultFile(outPath, profile.toJson().dump(2) + "\n");
  std::cout << "profile: " << outPath << "\n";
  return 0;
}

}  // namespace

namespace sb::cli {

Command addCalibrate(CLI::App& app) {
  struct Args {
    std::string calibBackend = "threads", calibMesh = "2x2", calibOut = "out/calibration.json";
    int64_t calibMax = int64_t{1} << 22;
  };
  const auto a = std::make_shared<Args>();
  auto* calib = app.add_subcommand(
      "calibrate",
      "Measure latency and bandwidth of each collective per mesh axis, and matmul "
      "throughput, into a cost profile");
  calib->add_option("--backend", a->calibBackend, "threads, or gloo under `stratbench launch`")
      ->check(CLI::IsMember(sb::harness::availableBackends()))
      ->capture_default_str();
  calib->add_option("--mesh", a->calibMesh, "Mesh shape, e.g. 2x2 or 4")->capture_default_str();
  calib->add_option("--out", a->calibOut, "Profile file (JSON)")
      ->check(sb::cli::pathName())
      ->capture_default_str();
  // At least two sizes (1024 and 4096 bytes): a bandwidth is fitted from the sizes' times, and
  // one size alone fits a latency with an infinite bandwidth.
  // The sizes measured are CalibrateOptions' (1 KiB to 4 MiB, times 4): the option leaves the
  // largest out, it adds none (4 GiB was taken and measured 4 MiB, without a word).
  calib
      ->add_option("--max-bytes", a->calibMax,
                   "Largest size per collective (4096 to 4194304: the sizes measured are 1 KiB "
                   "to 4 MiB, times 4)")
      ->check(sb::cli::wholeNumber(4096, uint64_t{1} << 22, "bytes"))
      ->capture_default_str();
  return {calib, [a] {
            try {
              return calibrateMain(a->calibBackend, a->calibMesh, a->calibOut, a->calibMax);
            } catch (const sb::harness::InputError& e) {
              std::cerr << "stratbench calibrate: " << sb::harness::errorText(e) << "\n";
              return kExitBadInput;
            } catch (const std::system_error& e) {
              // A thread or a socket the system would not give: not the input's fault.
              std::cerr << "stratbench calibrate: mesh " << a->calibMesh
                        << ": the system refused a resource: " << sb::harness::errorText(e) << "\n";
              return 1;
            } catch (const sb::harness::DistEnvError& e) {
              std::cerr << "stratbench calibrate: " << sb::harness::errorText(e) << "\n";
              return kExitBadInput;
            } catch (const c10::Error& e) {
              std::cerr << "stratbench calibrate: " << e.what_without_backtrace() << "\n";
              return kExitBadInput;
            } catch (const std::exception& e) {
              std::cerr << "stratbench calibrate: " << sb::harness::errorText(e) << "\n";
              return 1;
            }
          }};
}

}  // namespace sb::cli
