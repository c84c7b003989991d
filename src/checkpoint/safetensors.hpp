// The safetensors container (https://github.com/huggingface/safetensors, "Format"): an 8-byte
// little-endian header size N, N bytes of JSON, then the tensors' bytes. The JSON maps each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes after the
// header), plus an optional "__metadata__" of string to string. The bytes must be covered exactly
// by the tensors, without holes or overlaps; the header may be padded with spaces.
#pragma once

#include <pscoro/dtype.hpp>
#include <pscoro/value.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro::safetensors {

struct entry {
  std::string name;
  dtype type = dtype::float32;
  shape_type shape;
  std::uint64_t begin = 0;  // offsets into the data, after the header
  std::uint64_t end = 0;
  std::uint64_t size() const noexcept { return end - begin; }
};

using metadata_map = std::map<std::string, std::string, std::less<>>;

/// The safetensors code of `type` ("F32", "F64", "I32", "I64").
std::string_view code_of(dtype type) noexcept;

/// Assigns contiguous offsets to `entries` in order and returns the header: size prefix and JSON,
/// padded with spaces to a multiple of 8 bytes (the data then starts aligned).
std::string encode_header(std::vector<entry>& entries, const metadata_map& metadata);

struct header {
  std::vector<entry> entries;  // in data order
  metadata_map metadata;
  std::uint64_t data_start = 0;  // 8 + N
};

/// The header size N stored in a file's first 8 bytes `prefix`; checks that the header fits in a
/// file of `file_size` bytes. Throws errc::data_loss naming `path`.
std::uint64_t decode_header_size(std::string_view path, std::string_view prefix, std::uint64_t file_size);

/// Parses and checks the N header bytes `json` of a file of `file_size` bytes: valid JSON, known
/// dtypes, sizes that match the shapes, data covered exactly. Throws errc::data_loss naming `path`
/// and what is wrong.
header decode_header(std::string_view path, std::string_view json, std::uint64_t file_size);

/// The largest header accepted (the reference implementation's limit).
inline constexpr std::uint64_t max_header_size = 100'000'000;

}  // namespace pscoro::safetensors
