#pragma once

// Synthetic result rows for the report tests, written through the harness's own writer so that
// what the reports read is exactly what `run` writes.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness/run/records.h"
#include "harness/test/temp_dir.h"

namespace sb::reports::test {

// A fresh folder under the system's temporary folder, removed when the test binary exits.
inline std::string tempDir(const std::string& name) {
  return sb::test::scratchDir("sb_reports", name);
}

// A passing, timed row of case `caseName` and strategy `id`; `samples` are its repetitions.
inline harness::Record passRow(const std::string& caseName, const std::string& id,
                               std::vector<double> samples = {100, 101, 99, 100, 102, 98, 100, 101,
                                                              99, 100}) {
  harness::Record r;
  r.provenance.runId = "20261121T000000Z-0001";
  r.provenance.gitSha = "abc123";
  r.provenance.timestampUtc = "2026-11-21T00:00:00Z";
  r.provenance.host = "host";
  r.provenance.device = "cpu (test)";
  r.provenance.torchVersion = "1.13.1";
  r.backend = "threads";
  r.worldSize = 4;
  r.mesh = "2x2";
  r.suite = "smoke";
  r.caseName = caseName;
  r.workload = "linear";
  r.shape = "{\"input\":[4,16]}";
  r.dtype = "float32";
  r.inputs = "random";
  r.seed = 1;
  r.family = "sharding";
  r.strategyId = id;
  r.strategy = id;
  r.status = harness::Status::kPass;
  r.maxAbsErr = 1e-7;
  r.maxRelErr = 1e-6;
  r.mismatches = 0;
  r.atol = 1e-5;
  r.rtol = 1.3e-6;
  r.errRatio = 0.01;
  r.worstTensor = "output";
  r.tensorErrRatio = {{"output", 0.01}, {"grad_weight", 0.002}};
  r.timing = harness::TimingStats::fromSamples(samples, 1);
  r.repetitions = static_cast<int>(samples.size());
  r.peakMemBytes = 10000;
  r.predictedMemBytes = 9000;
  r.commBytes = 512;
  r.predictedCommBytes = 512;
  r.commCalls = 1;
  return r;
}

inline std::string writeRun(const std::string& dir, const std::vector<harness::Record>& rows) {
  harness::ResultWriter w(dir, nlohmann::json::object());
  for (const auto& r : rows) w.add(r);
  w.commit();
  return w.csvPath();
}

inline void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

}  // namespace sb::reports::test
