#include <pscoro/data_formats.hpp>

#include "data/file_reader.hpp"
#include "metrics/library.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace pscoro {

namespace {

[[noreturn]] void bad_field(const std::string& file, std::uint64_t line, std::string what) {
  throw error(errc::invalid_argument, fmt::format("{}:{}: {}", file, line, what));
}

// The lines of several files in order, with their file and line number.
class line_reader {
 public:
  explicit line_reader(std::shared_ptr<const std::vector<std::string>> paths) : paths_(std::move(paths)) {}

  /// The next line (without "\n" / "\r\n"), or false at the end of the last file.
  bool next(std::string& line) {
    while (true) {
      if (!stream_.is_open()) {
        if (next_file_ >= paths_->size()) return false;
        file_ = &(*paths_)[next_file_++];
        line_ = 0;
        stream_.open(*file_, std::ios::binary);
        if (!stream_) {
          throw error(errc::not_found, fmt::format("{}: cannot open: {}", *file_, std::strerror(errno)));
        }
      }
      if (std::getline(stream_, line)) {
        ++line_;
        metrics::dataset_bytes_read().inc(line.size() + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
      }
      if (stream_.bad()) throw error(errc::data_loss, fmt::format("{}: read error after line {}", *file_, line_));
      stream_.close();
    }
  }

  const std::string& file() const noexcept { return *file_; }
  std::uint64_t line() const noexcept { return line_; }
  bool first_line_of_file() const noexcept { return line_ == 1; }

 private:
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::size_t next_file_ = 0;
  const std::string* file_ = nullptr;
  std::uint64_t line_ = 0;
  std::ifstream stream_;
};

// The elements `parse` makes of the lines of `paths`, files of `format` ("CSV").
template <class T, class Parse>
dataset<T> line_dataset(std::string_view format, std::vector<std::string> paths, Parse parse) {
  auto description = data::describe_files(format, paths);
  auto shared = std::make_shared<const std::vector<std::string>>(std::move(paths));
  return dataset<T>([shared, parse]() {
    return detail::make_source<T>([reader = std::make_shared<line_reader>(shared), parse,
                                   line = std::string()]() mutable -> std::optional<T> {
      while (reader->next(line)) {
        if (auto item = parse(*reader, line)) return item;
      }
      return std::nullopt;
    });
  }, std::move(description));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <class V>
bool parse_number(std::string_view text, V& out) {
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && ptr == end;
}

}  // namespace

dataset<std::string> text_lines(std::vector<std::string> paths) {
  return line_dataset<std::string>("text", std::move(paths), [](line_reader&, std::string& line) {
    return std::optional<std::string>(line);
  });
}

namespace detail {

dataset<csv_row> csv_rows(std::vector<std::string> paths, csv_options options) {
  return line_dataset<csv_row>("CSV", std::move(paths), [options, columns = std::size_t{0}](
                                                     line_reader& reader, std::string& line) mutable
                                   -> std::optional<csv_row> {
    if (options.header && reader.first_line_of_file()) return std::nullopt;
    csv_row row{{}, &reader.file(), reader.line()};
    std::string field;
    bool quoted = false;
    std::size_t i = 0;
    while (true) {
      if (i == line.size()) {
        if (quoted) {
          // A quoted field may hold line ends (RFC 4180).
          std::string more;
          if (!reader.next(more)) bad_field(*row.file, row.line, "a quoted field is not closed");
          line += '\n';
          line += more;
          continue;
        }
        row.fields.push_back(std::move(field));
        break;
      }
      const char c = line[i++];
      if (quoted) {
        if (c == '"') {
          if (i < line.size() && line[i] == '"') {
            field += '"';
            ++i;
          } else {
            quoted = false;
          }
        } else {
          field += c;
        }
      } else if (c == '"' && trim(field).empty()) {
        field.clear();
        quoted = true;
      } else if (c == options.delimiter) {
        row.fields.push_back(std::move(field));
        field.clear();
      } else {
        field += c;
      }
    }
    if (row.fields.size() == 1 && row.fields.front().empty()) return std::nullopt;  // a blank line
    if (columns == 0) columns = row.fields.size();
    if (row.fields.size() != columns) {
      bad_field(*row.file, row.line, fmt::format("{} fields, but the first row has {}", row.fields.size(), columns));
    }
    return row;
  });
}

double csv_number(const csv_row& row, std::size_t column, const csv_options& options) {
  const auto text = trim(row.fields[column]);
  if (text.empty()) {
    if (options.empty_value) return *options.empty_value;
    bad_field(*row.file, row.line, fmt::format("column {} is empty", column + 1));
  }
  double value = 0;
  if (!parse_number(text, value)) {
    bad_field(*row.file, row.line, fmt::format("column {}: '{}' is not a number", column + 1, text));
  }
  return value;
}

}  // namespace detail

dataset<libsvm_example> libsvm(std::vector<std::string> paths) {
  return line_dataset<libsvm_example>("libsvm", std::move(paths), [](line_reader& reader, std::string& line)
                                                            -> std::optional<libsvm_example> {
    std::string_view rest(line);
    if (const auto hash = rest.find('#'); hash != std::string_view::npos) rest = rest.substr(0, hash);
    libsvm_example out;
    bool have_label = false;
    while (true) {
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
      if (rest.empty()) break;
      const auto end = rest.find_first_of(" \t");
      const auto token = rest.substr(0, end);
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
      if (!have_label) {
        if (!parse_number(token, out.label)) {
          bad_field(reader.file(), reader.line(), fmt::format("label '{}' is not a number", token));
        }
        have_label = true;
        continue;
      }
      const auto colon = token.find(':');
      if (colon == std::string_view::npos) {
        bad_field(reader.file(), reader.line(), fmt::format("'{}' is not index:value", token));
      }
      if (token.substr(0, colon) == "qid") continue;
      std::int64_t index = 0;
      float value = 0;
      if (!parse_number(token.substr(0, colon), index) || index < 0 || !parse_number(token.substr(colon + 1), value)) {
        bad_field(reader.file(), reader.line(), fmt::format("'{}' is not index:value", token));
      }
      if (!out.indices.empty() && index <= out.indices.back()) {
        bad_field(reader.file(), reader.line(),
                  fmt::format("indices must increase along a line: {} after {}", index, out.indices.back()));
      }
      out.indices.push_back(index);
      out.values.push_back(value);
    }
    if (!have_label) return std::nullopt;  // a blank or comment line
    return out;
  });
}

criteo_example parse_criteo_line(std::string_view line) {
  criteo_example out;
  std::size_t field = 0;
  std::size_t begin = 0;
  auto fail = [&](std::string what) {
    throw error(errc::invalid_argument, fmt::format("field {}: {}", field, what));
  };
  auto next = [&]() -> std::string_view {
    ++field;
    if (begin > line.size()) fail(fmt::format("missing: the line has {} fields, Criteo has 40", field - 1));
    std::size_t end = line.find('\t', begin);
    if (end == std::string_view::npos) end = line.size();
    const auto text = line.substr(begin, end - begin);
    begin = end + 1;
    return text;
  };
  const auto label = next();
  if (label != "0" && label != "1") fail(fmt::format("the label must be 0 or 1, not '{}'", label));
  out.label = label == "1" ? 1.0f : 0.0f;
  for (auto& value : out.integers) {
    const auto text = next();
    if (text.empty()) continue;
    std::int64_t v = 0;
    if (!parse_number(text, v)) fail(fmt::format("'{}' is not an integer", text));
    value = v;
  }
  for (auto& value : out.categories) {
    const auto text = next();
    if (text.empty()) continue;
    std::uint32_t v = 0;
    const auto* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, v, 16);
    if (text.size() != 8 || ec != std::errc{} || ptr != end) fail(fmt::format("'{}' is not 8 hex digits", text));
    value = v;
  }
  if (begin <= line.size()) fail("more than the 40 fields of a Criteo line");
  return out;
}

dataset<criteo_example> criteo_tsv(std::vector<std::string> paths) {
  return line_dataset<criteo_example>("Criteo TSV", std::move(paths), [](line_reader& reader, std::string& line)
                                                            -> std::optional<criteo_example> {
    if (line.empty()) return std::nullopt;
    try {
      return parse_criteo_line(line);
    } catch (const error& e) {
      bad_field(reader.file(), reader.line(), e.what());
    }
  });
}

namespace detail {

namespace {
std::size_t idx_element_size(std::uint8_t type) {
  switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}
}  // namespace

idx_reader::idx_reader(std::string path)
    : path_(std::move(path)), file_(std::make_unique<data::file_reader>(path_)) {  // plain or gzip
  read_header();
}

void idx_reader::read_header() {
  data::file_reader& file = *file_;
  unsigned char magic[4];
  if (file.read(magic, 4) != 4) {
    throw error(errc::data_loss, fmt::format("{}: too short for an IDX header", path_));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    throw error(errc::data_loss, fmt::format("{}: bad IDX magic {:02x} {:02x} {:02x} {:02x} at byte 0 (an IDX file "
                                             "starts with two zero bytes)",
                                             path_, magic[0], magic[1], magic[2], magic[3]));
  }
  type_ = magic[2];
  if (idx_element_size(type_) == 0) {
    throw error(errc::data_loss, fmt::format("{}: unknown IDX element type 0x{:02x} at byte 2 (known: 0x08 ubyte, "
                                             "0x09 byte, 0x0b short, 0x0c int, 0x0d float, 0x0e double)",
                                             path_, type_));
  }
  if (magic[3] == 0) {
    throw error(errc::data_loss, fmt::format("{}: an IDX file has at least one dimension, byte 3 says 0", path_));
  }
  offset_ = 4;
  for (int i = 0; i < magic[3]; ++i) {
    unsigned char be[4];
    if (file.read(be, 4) != 4) {
      throw error(errc::data_loss, fmt::format("{}: truncated at byte {} (in the {} dimensions of the header)", path_,
                                               offset_, magic[3]));
    }
    offset_ += 4;
    shape_.push_back((std::size_t{be[0]} << 24) | (std::size_t{be[1]} << 16) | (std::size_t{be[2]} << 8) | be[3]);
  }
  auto dimensions = [&] {
    std::string out;
    for (const auto d : shape_) out += (out.empty() ? "" : " x ") + std::to_string(d);
    return out;
  };
  // The data's size, checked for overflow: a header may claim up to 255 dimensions of 2^32 - 1.
  // The product without the zero dimensions must fit too (signed: xtensor's strides are
  // ptrdiff_t), or a row of no elements has strides that overflow (found by fuzzing).
  std::uint64_t row_bytes = idx_element_size(type_);
  std::uint64_t nonzero_bytes = row_bytes;
  for (std::size_t i = 1; i < shape_.size(); ++i) {
    if (__builtin_mul_overflow(row_bytes, std::uint64_t{shape_[i]}, &row_bytes) ||
        __builtin_mul_overflow(nonzero_bytes, std::uint64_t{std::max<std::size_t>(shape_[i], 1)}, &nonzero_bytes) ||
        nonzero_bytes > std::uint64_t{INT64_MAX}) {
      throw error(errc::data_loss, fmt::format("{}: IDX dimensions {} overflow a 64-bit byte count", path_,
                                               dimensions()));
    }
  }
  std::uint64_t data_bytes = 0;
  if (__builtin_mul_overflow(row_bytes, std::uint64_t{shape_[0]}, &data_bytes) ||
      __builtin_add_overflow(data_bytes, offset_, &data_bytes)) {
    throw error(errc::data_loss, fmt::format("{}: IDX dimensions {} overflow a 64-bit byte count", path_,
                                             dimensions()));
  }
  static_assert(sizeof(std::size_t) >= sizeof(std::uint64_t));
  row_bytes_ = row_bytes;
  // A plain file's length is known: check it now rather than rows (or epochs) later. A gzipped
  // file's is not (its trailer holds it modulo 2^32 only); it is checked as it is read.
  std::error_code ec;
  if (!file.compressed() && std::filesystem::is_regular_file(path_, ec)) {
    const auto length = std::filesystem::file_size(path_, ec);
    if (!ec && length != data_bytes) {
      throw error(errc::data_loss,
                  fmt::format("{}: the file is {} bytes long but its IDX header ({} of {}-byte elements) says {}",
                              path_, length, dimensions(), idx_element_size(type_), data_bytes));
    }
  }
}

idx_reader::~idx_reader() = default;

bool idx_reader::read_row(std::vector<std::byte>& out) {
  if (rows_read_ == shape_[0]) {
    unsigned char extra;
    if (file_->read(&extra, 1) > 0) {
      throw error(errc::data_loss,
                  fmt::format("{}: bytes after the last of its {} rows, at byte {}", path_, shape_[0], offset_));
    }
    return false;
  }
  // Grown as the bytes arrive: a gzipped file whose header claims a huge row fails as truncated
  // instead of allocating what the header says.
  constexpr std::size_t step = std::size_t{64} << 20;
  out.resize(std::min(row_bytes_, step));
  std::size_t got = 0;
  while (got < row_bytes_) {
    if (got == out.size()) out.resize(std::min(row_bytes_, out.size() + step));
    const std::size_t n = file_->read(out.data() + got, out.size() - got);
    if (n == 0) {
      throw error(errc::data_loss, fmt::format("{}: truncated at byte {}: row {} of {} is incomplete", path_,
                                               offset_ + got, rows_read_, shape_[0]));
    }
    got += n;
  }
  metrics::dataset_bytes_read().inc(got);
  offset_ += row_bytes_;
  ++rows_read_;
  return true;
}

double idx_reader::element(const std::vector<std::byte>& row, std::size_t i) const noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(row.data());
  auto be = [&](std::size_t size) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < size; ++b) v = (v << 8) | p[i * size + b];
    return v;
  };
  switch (type_) {
    case 0x08: return p[i];
    case 0x09: return static_cast<std::int8_t>(p[i]);
    case 0x0B: return static_cast<std::int16_t>(be(2));
    case 0x0C: return static_cast<std::int32_t>(be(4));
    case 0x0D: return std::bit_cast<float>(static_cast<std::uint32_t>(be(4)));
    case 0x0E: return std::bit_cast<double>(be(8));
    default: return 0;
  }
}

}  // namespace detail
}  // namespace pscoro
