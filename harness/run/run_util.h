#pragma once

// Small helpers that the runner's files share (the row on threads, the multi-process row, the
// planner, the suite loop): an exception's text without a backtrace, the wall clock, a duration
// as text. Their own file so that none of those files has to include another for them.

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace sb::harness {

// The exception's message; a c10::Error's without its backtrace. At most 4 KiB of it: a
// message that quotes what it refuses (a shape nested 60,000 deep) printed 120 KB; its head and
// its tail are kept, the bytes between counted.
std::string errorText(const std::exception& e);

// A value a user gave, as a message quotes it: whole up to `most` bytes, else its head, "...",
// and how long it was.
std::string shownValue(const std::string& value, size_t most = 200);

// Milliseconds since the epoch (wall clock), to order failures seen on different processes.
int64_t nowMs();

// "12.5 s".
std::string seconds(std::chrono::milliseconds ms);

}  // namespace sb::harness
