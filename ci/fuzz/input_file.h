#pragma once

// The fuzz targets whose reader takes a path: the input written to a file of this process's
// own, named with `suffix` (the readers tell some formats by their name), and its path.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

inline std::string fuzzInputFile(const uint8_t* data, size_t size, const std::string& suffix) {
  const std::string path = "/tmp/stratbench-fuzz-" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
