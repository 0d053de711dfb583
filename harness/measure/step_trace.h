#pragma once

// One step traced for other tools (`run --trace DIR`): per rank, a Chrome trace-event file of
// what the step did (ATen operators and autograd nodes through LibTorch's RecordFunction, the
// spans executors name with TraceScope: graph nodes, pipeline actions; every collective with
// its bytes) and the rank's allocations and frees, as counter events and as the lines of
// SB_MEMORY_TRACE (reports/memory_snapshot.py makes a PyTorch memory snapshot of them).
// Perfetto and chrome://tracing open the JSON. Nothing is recorded unless a thread is traced:
// a TraceScope costs an untraced step one thread-local read.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::harness {

// What one rank's traced step recorded.
struct StepTraceRecord {
  int rank = 0;
  nlohmann::json events = nlohmann::json::array();  // trace events, "ph" X (spans) and C
  std::vector<std::string> memoryLines;             // SB_MEMORY_TRACE's format
  int64_t peakBytes = 0;                            // the tracker's, over the step
};

// Traces the calling thread as `rank` until endStepTrace(): its operators and scopes, and every
// allocation and free of the rank's bucket (whichever thread makes it).
void beginStepTrace(int rank);
StepTraceRecord endStepTrace();

// A named span of the calling thread's traced step (category "node", "action", "collective",
// ...), with the bytes it moved where that means something (>= 0); nothing when the thread is
// not traced.
class TraceScope {
 public:
  TraceScope(const char* category, const std::string& name, int64_t bytes = -1);
  // A name that is a literal or otherwise outlives the scope: no string is made untraced.
  TraceScope(const char* category, const char* name, int64_t bytes = -1);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  bool on_ = false;
  const char* category_ = "";
  std::string name_;
  int64_t bytes_ = -1;
  int64_t startUs_ = 0;
};

// Whether the calling thread is traced (to skip building a scope's name otherwise).
bool stepTracing();

// The trace-event file of one or more ranks' records: {"traceEvents": [...], "displayTimeUnit":
// "ms", "otherData": {...}} with a process per rank (named "rank R").
nlohmann::json traceEventFile(const std::vector<StepTraceRecord>& ranks,
                              const nlohmann::json& about);

}  // namespace sb::harness
