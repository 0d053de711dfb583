#pragma once

// Small helpers that the runner's files share (the row on threads, the multi-process row, the
// planner, the suite loop): an exception's text without a backtrace, the wall clock, a duration
// as text. Their own file so that none of those files has to include another for them.

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace sb::harness {

// The exception's message; a c10::Error's without its backtrace.
std::string errorText(const std::exception& e);

// Milliseconds since the epoch (wall clock), to order failures seen on different processes.
int64_t nowMs();

// "12.5 s".
std::string seconds(std::chrono::milliseconds ms);

}  // namespace sb::harness
