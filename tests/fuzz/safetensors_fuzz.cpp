// The safetensors reader: checkpoint_reader on a file holding the input, then every tensor, the
// metadata, the step and the scalars read back. Bad files must be errc::data_loss (or
// failed_precondition: a pscoro checkpoint of a format version this build does not read); what
// opens must read back without a crash.
#include "temp_file.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/error.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

bool expected(const pscoro::error& e) {
  return e.code() == pscoro::errc::data_loss || e.code() == pscoro::errc::failed_precondition;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.safetensors");
  const auto& path = file.write(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    pscoro::checkpoint_reader reader{std::filesystem::path(path)};
    (void)reader.metadata();
    for (const auto& name : reader.names()) {
      if (!reader.contains(name)) broken("names() lists '" + name + "' but contains() does not");
      (void)reader.dtype(name);
      const auto& shape = reader.shape(name);
      try {
        const auto t = reader.read_tensor(name);
        if (t.shape() != shape) broken("read_tensor's shape differs from shape() for '" + name + "'");
      } catch (const pscoro::error& e) {
        if (!expected(e)) broken(std::string("read_tensor: not data_loss: ") + e.what());
      }
    }
    try {
      (void)reader.step();
      (void)reader.scalars();
    } catch (const pscoro::error& e) {
      if (!expected(e)) broken(std::string("step/scalars: not data_loss: ") + e.what());
    }
  } catch (const pscoro::error& e) {
    if (!expected(e)) broken(std::string("checkpoint_reader: not data_loss: ") + e.what());
  }
  return 0;
}
