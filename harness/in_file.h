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

// "" where `path` is a regular file (or a link to one); otherwise why it cannot be read as a
// file, for the reader's message: "no such file", "a symbolic link to nothing", "a loop of
// symbolic links (Too many levels of symbolic links)", or what notARegularFile says.
inline std::string whyNotAFile(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ec == std::errc::too_many_symbolic_link_levels
               ? "a loop of symbolic links, not a file"
               : "cannot be read (" + ec.message() + ")";
  }
  if (!std::filesystem::exists(st)) {
    std::error_code lec;
    return std::filesystem::is_symlink(std::filesystem::symlink_status(path, lec))
               ? "a symbolic link to nothing (its target does not exist)"
               : "no such file";
  }
  return notARegularFile(path);
}

}  // namespace sb::harness
