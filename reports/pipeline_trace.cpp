// A pipeline row's measured and predicted runs as one Chrome trace (report_internal.h).

#include <nlohmann/json.hpp>

#include "reports/report_internal.h"

namespace sb::reports {

std::string pipelineTrace(const nlohmann::json& runs) {
  nlohmann::json events = nlohmann::json::array();
  int pid = 0;
  for (const char* side : {"measured", "predicted"}) {
    const nlohmann::json& run = runs.value(side, nlohmann::json());
    if (!run.is_object()) continue;
    events.push_back(
        {{"name", "process_name"},
         {"ph", "M"},
         {"pid", pid},
         {"args", {{"name", std::string(side) == "measured" ? "measured" : "dry run"}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"sort_index", pid}}}});
    for (const auto& rank : run.value("per_rank", nlohmann::json::array())) {
      const int tid = rank.value("rank", 0);
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"args", {{"name", "rank " + std::to_string(tid)}}}});
      for (const auto& a : rank.value("actions", nlohmann::json::array())) {
        const std::string name = a.value("action", std::string("?"));
        const auto type = name.find_first_not_of("0123456789");
        const double start = a.value("start_us", 0.0), end = a.value("end_us", 0.0);
        events.push_back({{"name", name},
                          {"cat", type == std::string::npos ? "?" : name.substr(type, 1)},
                          {"ph", "X"},
                          {"pid", pid},
                          {"tid", tid},
                          {"ts", start},
                          {"dur", end - start}});
      }
    }
    ++pid;
  }
  const nlohmann::json& m = runs.value("measured", nlohmann::json::object());
  return nlohmann::json({{"traceEvents", events},
                         {"displayTimeUnit", "ms"},
                         {"otherData", {{"schedule", m.value("schedule", std::string())}}}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace sb::reports
