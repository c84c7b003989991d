// Replays inputs through a fuzz target without libFuzzer: the default build links every target in
// tests/fuzz with this main and meson runs it over the committed seed corpus (suite "fuzz"), so
// plain CI and the sanitizer build replay every seed and every past crash in seconds.
//
//   frame_reader_replay tests/fuzz/corpus/frame_reader [more files or directories...]
//
// Prints one line per input that fails and, for scripts/count_tests.py, "1 passed, 0 failed" (the
// corpus replayed clean: one test case per target) or "0 passed, 1 failed". A crash or a sanitizer
// report ends the process, which meson counts as a failure and whose log names the input.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      std::printf("0 passed, 1 failed\n");
      return 1;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs to replay (give the corpus directory)\n");
    std::printf("0 passed, 1 failed\n");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  std::size_t failed = 0;
  for (const auto& path : inputs) {
    std::ifstream file(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    // The input's name first, so a crash's log says which one it was.
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      // libFuzzer would abort on an exception a target lets out; say which input and go on.
      std::printf("FAILED %s: uncaught exception: %s\n", path.c_str(), e.what());
      ++failed;
    }
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::printf("replayed %zu inputs in %.2f s\n", inputs.size(), took.count());
  std::printf("%d passed, %d failed\n", failed == 0 ? 1 : 0, failed == 0 ? 0 : 1);
  return failed == 0 ? 0 : 1;
}
