#pragma once

// Files a user names for reading (a profile, a plan, a chain, a noise file, golden losses, a
// schedule): a folder, a FIFO or a device would block the reader forever or fail inside the
// stream library, so each reader asks this first and refuses in its own words.

#include <filesystem>
#include <string>
#include <system_error>

namespace sb::harness {

// "" where `path` is a regular file, or does not exist (the reader then says it cannot read
// it); otherwise what it is instead, for the message: "not a regular file (a folder, a FIFO or
// a device)".
inline std::string notARegularFile(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st) || std::filesystem::is_regular_file(st)) return "";
  return "not a regular file (a folder, a FIFO or a device); give the file itself";
}

}  // namespace sb::harness
