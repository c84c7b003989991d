#include "checkpoint/safetensors.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

namespace pscoro::safetensors {

namespace {

using json = nlohmann::json;

[[noreturn]] void corrupt(std::string_view path, std::string_view what) {
  throw error(errc::data_loss, fmt::format("checkpoint {}: {}", path, what));
}

std::optional<dtype> dtype_of_code(std::string_view code) {
  for (const auto t : {dtype::float32, dtype::float64, dtype::int32, dtype::int64}) {
    if (code == code_of(t)) return t;
  }
  return std::nullopt;
}

}  // namespace

std::string_view code_of(dtype type) noexcept {
  switch (type) {
    case dtype::float32: return "F32";
    case dtype::float64: return "F64";
    case dtype::int32: return "I32";
    case dtype::int64: return "I64";
  }
  return "?";
}

std::string encode_header(std::vector<entry>& entries, const metadata_map& metadata) {
  json root = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    root["__metadata__"] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (auto& e : entries) {
    e.begin = offset;
    e.end = offset += num_elements(e.shape) * size_of(e.type);
    root[e.name] = {{"dtype", code_of(e.type)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = root.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

std::uint64_t decode_header_size(std::string_view path, std::string_view prefix, std::uint64_t file_size) {
  if (file_size < 8 || prefix.size() < 8) {
    corrupt(path, fmt::format("{} bytes is too short for a safetensors file (8-byte header size first)", file_size));
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<std::size_t>(i)]);
  if (n > max_header_size) corrupt(path, fmt::format("header size {} is beyond the limit of {}", n, max_header_size));
  if (n < 2) corrupt(path, fmt::format("header size {} cannot hold a JSON object", n));
  if (8 + n > file_size) {
    corrupt(path, fmt::format("the header says it has {} bytes but the file ends after {} (truncated?)", n,
                              file_size - 8));
  }
  return n;
}

header decode_header(std::string_view path, std::string_view text, std::uint64_t file_size) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) corrupt(path, "the header is not valid JSON");
  if (!root.is_object()) corrupt(path, "the header is not a JSON object");
  header out;
  out.data_start = 8 + text.size();
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) corrupt(path, "__metadata__ is not an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) corrupt(path, fmt::format("__metadata__[\"{}\"] is not a string", key));
        out.metadata.emplace(key, v.get<std::string>());
      }
      continue;
    }
    const auto where = fmt::format("tensor \"{}\"", name);
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      corrupt(path, where + " needs dtype, shape and data_offsets");
    }
    const auto& code = value["dtype"];
    const auto type = code.is_string() ? dtype_of_code(code.get<std::string>()) : std::nullopt;
    if (!type) {
      corrupt(path, fmt::format("{} has dtype {}; pscoro reads F32, F64, I32 and I64", where, code.dump()));
    }
    entry e{name, *type, {}, 0, 0};
    const auto& shape = value["shape"];
    if (!shape.is_array()) corrupt(path, where + ": shape is not an array");
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) corrupt(path, fmt::format("{}: shape {} is not a list of sizes", where, shape.dump()));
      e.shape.push_back(d.get<std::size_t>());
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      corrupt(path, where + ": data_offsets is not [begin, end]");
    }
    e.begin = offsets[0].get<std::uint64_t>();
    e.end = offsets[1].get<std::uint64_t>();
    // Overflow-safe: a shape whose byte count does not fit cannot match any offsets.
    std::uint64_t bytes = size_of(e.type);
    for (const auto d : e.shape) {
      if (d != 0 && bytes > UINT64_MAX / d) corrupt(path, where + ": the shape is too large");
      bytes *= d;
    }
    if (e.end < e.begin || e.end - e.begin != bytes) {
      corrupt(path, fmt::format("{}: data_offsets [{}, {}) do not hold {} {} ({} bytes)", where, e.begin, e.end,
                                code.get<std::string>(), to_string(e.shape), bytes));
    }
    out.entries.push_back(std::move(e));
  }
  std::sort(out.entries.begin(), out.entries.end(), [](const entry& a, const entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (const auto& e : out.entries) {
    if (e.begin != covered) {
      corrupt(path, fmt::format("tensor \"{}\" starts at byte {} of the data where {} was expected (a hole or an "
                                "overlap)",
                                e.name, e.begin, covered));
    }
    covered = e.end;
  }
  const std::uint64_t data_size = file_size - out.data_start;
  if (covered != data_size) {
    corrupt(path, fmt::format("the tensors cover {} bytes of data but the file holds {}{}", covered, data_size,
                              covered > data_size ? " (truncated?)" : ""));
  }
  return out;
}

}  // namespace pscoro::safetensors
