// The safetensors reader: checkpoint_reader on a file holding the input, then every tensor, the
// metadata, the step and the scalars read back, once as a pscoro checkpoint (the default) and once
// allowing files of other tools, unverified. Bad files must be errc::data_loss (or
// failed_precondition: a pscoro checkpoint of a format version this build does not read, or, by
// default, a file that is not a pscoro checkpoint); what opens must read back without a crash.
// By default, only a pscoro checkpoint with a checksum for every tensor (and, from format version
// 2, one of its header) opens.
#include "temp_file.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/error.hpp>
#include <pscoro/log.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
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

// What the default reader may open: a pscoro checkpoint whose crc32c record names every tensor.
void check_verified_whole(const pscoro::checkpoint_reader& reader) {
  const auto& metadata = reader.metadata();
  const auto format = metadata.find("format");
  if (format == metadata.end() || format->second != pscoro::checkpoint_format) {
    broken("a file that is not a pscoro checkpoint opened without allow_unverified");
  }
  const auto record = metadata.find("crc32c");
  if (record == metadata.end()) broken("a pscoro checkpoint without a crc32c record opened");
  const auto version = metadata.find("format_version");
  int v = 0;
  if (version != metadata.end()) {
    std::from_chars(version->second.data(), version->second.data() + version->second.size(), v);
  }
  if (v >= 2 && !metadata.contains("header_crc32c")) {
    broken("a pscoro checkpoint of format version " + version->second + " opened without its header's checksum");
  }
  const auto crcs = nlohmann::json::parse(record->second, nullptr, false);
  for (const auto& name : reader.names()) {
    if (!crcs.is_object() || !crcs.contains(name)) broken("tensor '" + name + "' opened without a checksum");
  }
}

void read_all(const std::string& path, pscoro::checkpoint_read_options options) {
  try {
    pscoro::checkpoint_reader reader{std::filesystem::path(path), options};
    if (!options.allow_unverified) check_verified_whole(reader);
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
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.safetensors");
  // Every file of another tool read unverified is logged: a warning per input is noise here.
  static const bool quiet = (pscoro::set_log_level(pscoro::log_level::error), true);
  (void)quiet;
  const auto& path = file.write(std::string_view(reinterpret_cast<const char*>(data), size));
  read_all(path, {});
  read_all(path, {.allow_unverified = true});
  return 0;
}
