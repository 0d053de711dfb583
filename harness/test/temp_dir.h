#pragma once

// Temporary folders for tests: PREFIX_NAME_PID under the system's temporary folder, emptied
// when handed out and removed when the test binary exits.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace sb::test {

inline std::string scratchDir(const std::string& prefix, const std::string& name,
                              bool create = true) {
  struct Cleanup {
    std::vector<std::filesystem::path> dirs;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Cleanup cleanup;
  const auto d = std::filesystem::temp_directory_path() /
                 (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  if (create) std::filesystem::create_directories(d);
  cleanup.dirs.push_back(d);
  return d.string();
}

}  // namespace sb::test
