// One step traced for other tools (see step_trace.h).

#include "harness/measure/step_trace.h"

#include <chrono>
#include <memory>
#include <mutex>

#include <ATen/record_function.h>

#include "harness/measure/memory.h"

namespace sb::harness {
namespace {

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A traced rank's record in the making. Its events come from its own thread (operators,
// scopes) and from whichever thread allocates or frees its memory: under `mu`.
struct State {
  int rank = 0;
  std::mutex mu;
  StepTraceRecord record;
  int64_t live = 0;
};

struct Open {
  const char* name;
  bool backward;
  int64_t startUs;
};

thread_local State* tState = nullptr;
thread_local std::vector<Open> tOpen;  // the RecordFunction scopes open on this thread
thread_local at::CallbackHandle tHandle = 0;

void addEvent(State& s, nlohmann::json e) {
  std::lock_guard<std::mutex> lock(s.mu);
  s.record.events.push_back(std::move(e));
}

std::unique_ptr<at::ObserverContext> opStarted(const at::RecordFunction& fn) {
  tOpen.push_back({fn.name(), fn.scope() == at::RecordScope::BACKWARD_FUNCTION, nowUs()});
  return nullptr;
}

void opEnded(const at::RecordFunction&, at::ObserverContext*) {
  if (tOpen.empty()) return;
  const Open o = tOpen.back();
  tOpen.pop_back();
  if (!tState) return;
  addEvent(*tState, {{"name", o.name},
                     {"cat", o.backward ? "autograd" : "op"},
                     {"ph", "X"},
                     {"ts", o.startUs},
                     {"dur", nowUs() - o.startUs},
                     {"pid", tState->rank},
                     {"tid", 0}});
}

// The allocating thread's open scopes, as SB_MEMORY_TRACE names them (formatOpContext).
std::string opContext() {
  std::vector<const char*> names;
  for (const Open& o : tOpen) names.push_back(o.name);
  return formatOpContext(names);
}

}  // namespace

bool stepTracing() { return tState != nullptr; }

void beginStepTrace(int rank) {
  auto* s = new State;
  s->rank = rank;
  auto& mem = MemoryTracker::instance();
  s->live = mem.current(rank);
  s->record.rank = rank;
  s->record.peakBytes = s->live;
  // What the rank holds as the step starts, as allocations of their own (memory_snapshot.py
  // shows them as "allocated before the step"), then the step's window.
  int64_t held = 0;
  for (const auto& [ptr, bytes] : mem.liveBlocks(rank)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", ptr);
    held += bytes;
    s->record.memoryLines.push_back("mem +" + std::to_string(bytes) + " -> " +
                                    std::to_string(held) + " @" + buf);
  }
  s->record.memoryLines.push_back("mem reset at " + std::to_string(s->live));
  tState = s;
  tOpen.clear();
  tHandle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&opStarted, &opEnded)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  mem.setListener(rank, [s](int64_t delta, int64_t live, const void* ptr) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", ptr);
    const int64_t t = nowUs();
    std::lock_guard<std::mutex> lock(s->mu);
    s->live = live;
    s->record.peakBytes = std::max(s->record.peakBytes, live);
    s->record.memoryLines.push_back(delta >= 0 ? "mem +" + std::to_string(delta) + " -> " +
                                                     std::to_string(live) + " @" + buf + opContext()
                                               : "mem -" + std::to_string(-delta) + " -> " +
                                                     std::to_string(live) + " @" + buf);
    s->record.events.push_back({{"name", "live bytes"},
                                {"ph", "C"},
                                {"ts", t},
                                {"pid", s->rank},
                                {"args", {{"bytes", live}}}});
  });
}

StepTraceRecord endStepTrace() {
  State* s = tState;
  TORCH_INTERNAL_ASSERT(s, "endStepTrace without beginStepTrace on this thread");
  MemoryTracker::instance().setListener(s->rank, nullptr);
  at::removeCallback(tHandle);
  tState = nullptr;
  tOpen.clear();
  std::unique_ptr<State> owned(s);
  owned->record.memoryLines.push_back("mem end of the measured step at " +
                                      std::to_string(owned->live) + ", peak " +
                                      std::to_string(owned->record.peakBytes));
  return std::move(owned->record);
}

TraceScope::TraceScope(const char* category, const std::string& name, int64_t bytes)
    : TraceScope(category, name.c_str(), bytes) {}

TraceScope::TraceScope(const char* category, const char* name, int64_t bytes) {
  if (!tState) return;
  on_ = true;
  category_ = category;
  name_ = name;  // copied: the caller's string may not outlive the scope
  bytes_ = bytes;
  startUs_ = nowUs();
}

TraceScope::~TraceScope() {
  if (!on_ || !tState) return;
  nlohmann::json e = {{"name", name_},  {"cat", category_},          {"ph", "X"},
                      {"ts", startUs_}, {"dur", nowUs() - startUs_}, {"pid", tState->rank},
                      {"tid", 0}};
  if (bytes_ >= 0) e["args"] = {{"bytes", bytes_}};
  addEvent(*tState, std::move(e));
}

nlohmann::json traceEventFile(const std::vector<StepTraceRecord>& ranks,
                              const nlohmann::json& about) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& r : ranks) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
    for (const auto& e : r.events) events.push_back(e);
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", about}};
}

}  // namespace sb::harness
