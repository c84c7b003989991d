// A file in the temporary directory, one per process, that a fuzz target rewrites per input: the
// readers under test take paths.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace pscoro::fuzz {

class temp_file {
 public:
  explicit temp_file(std::string_view name)
      : path_(std::filesystem::temp_directory_path() /
              ("pscoro-fuzz-" + std::to_string(::getpid()) + "-" + std::string(name))) {}
  ~temp_file() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;

  const std::string& write(std::string_view bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path_;
  }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace pscoro::fuzz
