// Checkpoints: planning (which bytes of which shard go where in the file), the streaming pipelines
// (a network read overlaps the previous piece's disk write, and the reverse on restore), the
// crash-safe file dance, the manager and the reader.
#include <pscoro/checkpoint.hpp>
#include <pscoro/detail/parallel.hpp>
#include <pscoro/strategy.hpp>

#include "checkpoint/safetensors.hpp"
#include "chief/coordinator_core.hpp"
#include "chief/lost_ps_restorer.hpp"
#include "chief/restore_on_create.hpp"
#include "common/crc32c.hpp"
#include "common/id_hash.hpp"
#include "common/log.hpp"
#include "common/regular_file.hpp"
#include "common/text.hpp"
#include "metrics/cluster_view.hpp"
#include "wire/values.hpp"

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <vector>

namespace pscoro {

namespace fs = std::filesystem;

using json = nlohmann::json;

namespace detail {

// A slot in a checkpoint's metadata (outside the anonymous namespace: checkpoint_state keeps them).
struct checkpoint_slot_record {
  std::string tensor;    // "<variable>/<optimizer>/<slot>"
  std::string variable;  // the variable's name
  std::string suffix;    // "<optimizer>/<slot>"
  double initial_value = 0;
  bool per_shard = false;
};

// The file a checkpoint wrote or restored last: what its next incremental save builds on.
struct saved_file {
  fs::path path;
  std::uint64_t save_id = 0;  // 0: a file without one (written before incremental saves)
  std::size_t depth = 0;      // increments since its last whole save (0: it is whole)
};

}  // namespace detail

namespace {

// ---------------------------------------------------------------------------------------------
// Files: POSIX, because the crash-safety dance needs fsync of the file and of its directory.

// The settings that name a checkpoint file, for the error that refuses a FIFO or a directory there.
constexpr std::string_view read_setting = "the path given to checkpoint::restore or checkpoint_reader";
constexpr std::string_view save_setting = "the path given to checkpoint::save";

// A regular file: anything else that `path` names (a FIFO would block open(2)) is refused as
// `setting`.
class posix_file {
 public:
  posix_file(const fs::path& path, int flags, std::string_view setting, mode_t mode = 0644) : path_(path.string()) {
    fd_ = common::open_regular_file("checkpoint", path_, flags, mode, setting);
    if (fd_ < 0) {
      throw error(errno == ENOENT ? errc::not_found : errc::unavailable,
                  fmt::format("checkpoint {}: cannot open: {}", path_, std::strerror(errno)));
    }
  }
  ~posix_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  posix_file(const posix_file&) = delete;
  posix_file& operator=(const posix_file&) = delete;

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("stat");
    return static_cast<std::uint64_t>(st.st_size);
  }
  void write_at(const void* data, std::size_t size, std::uint64_t offset) const {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write");
      p += n;
      size -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
  }
  void read_at(void* data, std::size_t size, std::uint64_t offset) const {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
      const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("read");
      if (n == 0) throw error(errc::data_loss, fmt::format("checkpoint {}: ends early (truncated?)", path_));
      p += n;
      size -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
  }
  void sync() const {
    if (::fsync(fd_) != 0) fail("fsync");
  }
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("close");
  }
  const std::string& path() const noexcept { return path_; }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw error(errc::unavailable, fmt::format("checkpoint {}: {} failed: {}", path_, what, std::strerror(errno)));
  }
  std::string path_;
  int fd_ = -1;
};

void sync_directory(const fs::path& dir) {
  const std::string path = dir.empty() ? std::string(".") : dir.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int why = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) {
    throw error(errc::unavailable,
                fmt::format("checkpoint: fsync of directory {} failed: {}", path, std::strerror(why)));
  }
}

std::string hex32(std::uint32_t v) { return fmt::format("{:08x}", v); }
std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

// A save's id: random and never 0, so that no two saves of one table share one (a part builds an
// increment only on the save it knows by that id).
std::uint64_t new_save_id() {
  std::random_device device;
  std::uint64_t id = 0;
  while (id == 0) id = (std::uint64_t{device()} << 32) ^ device();
  return id;
}

// Exactly 16 hex digits, as hex64 writes them.
std::optional<std::uint64_t> parse_hex64(std::string_view text) {
  std::uint64_t v = 0;
  if (text.size() != 16) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// Exactly 8 hex digits, as hex32 writes them.
std::optional<std::uint32_t> parse_hex32(std::string_view text) {
  std::uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (ec != std::errc{} || end != text.data() + text.size() || text.size() != 8) return std::nullopt;
  return v;
}

// The JSON object stored as a string in metadata `key`, or an empty object.
json metadata_json(const safetensors::metadata_map& metadata, std::string_view key, std::string_view path) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) return json::object();
  json out = json::parse(it->second, nullptr, false);
  if (out.is_discarded() || !out.is_object()) {
    throw error(errc::data_loss, fmt::format("checkpoint {}: __metadata__[\"{}\"] is not a JSON object", path, key));
  }
  return out;
}

// Bytes per row (axis 0) of a tensor of `shape`; 0 for a scalar.
std::size_t row_bytes_of(const shape_type& shape, dtype type) {
  return shape.empty() ? 0 : num_elements(std::span(shape).subspan(1)) * size_of(type);
}

// Rows per piece of at most `chunk_bytes` (never less than one row).
std::uint64_t rows_per_piece(std::size_t chunk_bytes, std::size_t row_bytes) {
  return std::max<std::uint64_t>(1, chunk_bytes / std::max<std::size_t>(row_bytes, 1));
}

// A buffer of `bytes` holding `value` converted to `type`, element after element.
byte_buffer filled(dtype type, std::size_t bytes, double value) {
  byte_buffer out(bytes);
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(reinterpret_cast<T*>(out.data()), bytes / sizeof(T), static_cast<T>(value));
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// A slot in a checkpoint: a row-sharded slot is stored with its variable's full shape; a slot of
// another shape (adam's per-shard step count) is stored per shard, as [shards, ...].

using slot_record = detail::checkpoint_slot_record;

json encode_slots(const std::vector<slot_record>& slots) {
  json out = json::object();
  for (const auto& s : slots) {
    out[s.tensor] = {{"variable", s.variable}, {"slot", s.suffix}, {"initial_value", s.initial_value},
                     {"per_shard", s.per_shard}};
  }
  return out;
}

std::vector<slot_record> decode_slots(const json& slots, std::string_view path) {
  std::vector<slot_record> out;
  for (const auto& [tensor, s] : slots.items()) {
    if (!s.is_object() || !s.contains("variable") || !s["variable"].is_string() || !s.contains("slot") ||
        !s["slot"].is_string() || !s.contains("initial_value") || !s["initial_value"].is_number() ||
        !s.contains("per_shard") || !s["per_shard"].is_boolean()) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: the slot record of \"{}\" is malformed", path, tensor));
    }
    out.push_back({tensor, s["variable"].get<std::string>(), s["slot"].get<std::string>(),
                   s["initial_value"].get<double>(), s["per_shard"].get<bool>()});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Save: pieces of the file in order, each a run of rows of one shard (or a fill, for a slot a
// shard does not have yet), fetched from the network while the previous one is written.

using io_ptr = std::shared_ptr<detail::variable_io>;

struct save_piece {
  std::size_t entry = 0;  // index of the tensor in the file
  dtype type = dtype::float32;
  io_ptr io;
  variable_ref source;  // the shard (or slot) to read; unset name: a fill
  bool rows = true;     // rows [begin, end) of source, else the whole source
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t bytes = 0;
  double fill = 0;
};

// The file's tensors in order, the pieces that fill them, and the slots its metadata describes.
struct save_plan {
  std::vector<safetensors::entry> entries;
  std::vector<save_piece> pieces;
  std::vector<slot_record> slots;
};

// Rows [0, rows) of `source` into the last tensor of `plan`, in pieces of at most `chunk_bytes`
// (at least one row); an unnamed source gives pieces of `fill` instead.
void add_row_pieces(save_plan& plan, dtype type, const io_ptr& io, const variable_ref& source, std::size_t row_bytes,
                    std::uint64_t rows, std::size_t chunk_bytes, double fill = 0) {
  const std::uint64_t per_piece = rows_per_piece(chunk_bytes, row_bytes);
  for (std::uint64_t begin = 0; begin < rows; begin += per_piece) {
    const std::uint64_t end = std::min(rows, begin + per_piece);
    plan.pieces.push_back({.entry = plan.entries.size() - 1,
                           .type = type,
                           .io = io,
                           .source = source,
                           .rows = true,
                           .begin = begin,
                           .end = end,
                           .bytes = (end - begin) * row_bytes,
                           .fill = fill});
  }
}

// All of `source` (`bytes` of it) into the last tensor of `plan` as one piece; an unnamed source
// gives a piece of `fill` instead.
void add_whole_piece(save_plan& plan, dtype type, const io_ptr& io, const variable_ref& source, std::uint64_t bytes,
                     double fill = 0) {
  plan.pieces.push_back({.entry = plan.entries.size() - 1,
                         .type = type,
                         .io = io,
                         .source = source,
                         .rows = false,
                         .bytes = bytes,
                         .fill = fill});
}

// Variable `v` as one tensor of its whole shape, filled shard after shard.
void plan_variable(save_plan& plan, const detail::checkpoint_variable& v, std::size_t chunk_bytes) {
  const auto& ref = v.ref;
  plan.entries.push_back({.name = ref.name, .type = ref.type, .shape = ref.shape});
  for (const auto& shard : ref.shards) {
    if (ref.shape.empty()) {
      add_whole_piece(plan, ref.type, v.io, shard, size_of(ref.type));
    } else {
      add_row_pieces(plan, ref.type, v.io, shard, row_bytes_of(ref.shape, ref.type), shard.shape[0], chunk_bytes);
    }
  }
}

// Per "<optimizer>/<slot>", the slot on each shard (none where that shard has not been updated yet).
using slots_by_shard = std::map<std::string, std::vector<std::optional<detail::variable_io::slot_info>>>;

asio::awaitable<slots_by_shard> find_slots(const detail::checkpoint_variable& v) {
  const auto& shards = v.ref.shards;
  slots_by_shard found;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    for (auto& info : co_await v.io->list_slots(shards[i])) {
      auto& per_shard = found[info.slot.name.substr(shards[i].name.size() + 1)];
      per_shard.resize(shards.size());
      per_shard[i] = std::move(info);
    }
  }
  co_return found;
}

// Slot `suffix` of `v` as one tensor: of the variable's whole shape when every shard's slot has
// its shard's shape, else ([shards] + the slot's shape) one value per shard. A shard without the
// slot contributes the slot's starting value.
void plan_slot(save_plan& plan, const detail::checkpoint_variable& v, const std::string& suffix,
               const std::vector<std::optional<detail::variable_io::slot_info>>& per_shard, std::size_t chunk_bytes) {
  const auto& ref = v.ref;
  const auto& any = *std::find_if(per_shard.begin(), per_shard.end(), [](const auto& s) { return s.has_value(); });
  const dtype type = any->slot.type;
  const shape_type& slot_shape = any->slot.shape;
  bool row_sharded = true;
  bool same_shape = true;
  for (std::size_t i = 0; i < ref.shards.size(); ++i) {
    if (!per_shard[i]) continue;
    row_sharded = row_sharded && per_shard[i]->slot.shape == ref.shards[i].shape;
    same_shape = same_shape && per_shard[i]->slot.shape == slot_shape;
    if (per_shard[i]->slot.type != type) {
      throw error(errc::failed_precondition,
                  fmt::format("checkpoint: slot '{}' of '{}' has different dtypes on different shards", suffix,
                              ref.name));
    }
  }
  if (!row_sharded && !same_shape) {
    throw error(errc::failed_precondition,
                fmt::format("checkpoint: slot '{}' of '{}' has different shapes on different shards", suffix,
                            ref.name));
  }
  slot_record record{.tensor = ref.name + "/" + suffix,
                     .variable = ref.name,
                     .suffix = suffix,
                     .initial_value = any->initial_value,
                     .per_shard = !row_sharded};
  shape_type full = ref.shape;
  if (record.per_shard) {
    full = shape_type{ref.shards.size()};
    full.insert(full.end(), slot_shape.begin(), slot_shape.end());
  }
  plan.entries.push_back({.name = record.tensor, .type = type, .shape = full});
  for (std::size_t i = 0; i < ref.shards.size(); ++i) {
    const variable_ref source = per_shard[i] ? per_shard[i]->slot : variable_ref{};
    if (record.per_shard || ref.shape.empty()) {
      add_whole_piece(plan, type, v.io, source, num_elements(slot_shape) * size_of(type), record.initial_value);
    } else {
      add_row_pieces(plan, type, v.io, source, row_bytes_of(ref.shape, type), ref.shards[i].shape[0], chunk_bytes,
                     record.initial_value);
    }
  }
  plan.slots.push_back(std::move(record));
}

// The header's own checksum: `"header_crc32c":"<8 hex digits>"` in `__metadata__`, the CRC-32C of
// the header (its 8-byte size and its JSON) with those digits read as zeros. It covers what the
// tensors' checksums do not (the step, the scalars, the slot records, the checksums themselves).
constexpr std::string_view header_crc_key = "\"header_crc32c\":\"";

// Where the header checksum's digits are in a header's JSON `text`, found as written: once, compact.
// An unescaped quote cannot occur inside a JSON string, so the key is not found inside a name or a
// value. None when it is missing, repeated or cut.
std::optional<std::size_t> header_crc_digits(std::string_view text) {
  const auto at = text.find(header_crc_key);
  if (at == std::string_view::npos || text.find(header_crc_key, at + 1) != std::string_view::npos ||
      at + header_crc_key.size() + 8 > text.size()) {
    return std::nullopt;
  }
  return at + header_crc_key.size();
}

// The checksum of header `prefix` (its size) and `text` (its JSON), the digits at `digits` read as
// zeros.
std::uint32_t header_crc_of(std::string_view prefix, std::string text, std::size_t digits) {
  text.replace(digits, 8, "00000000");
  return common::crc32c_extend(common::crc32c(prefix.data(), prefix.size()), text.data(), text.size());
}

// The file's `__metadata__`, with `crcs` as the tensors' checksums (zeros at first: a placeholder
// of the final length, rewritten once the tensors are written) and the header's own checksum as
// zeros (with_header_crc fills it in).
safetensors::metadata_map metadata_of(const save_plan& plan, std::int64_t step,
                                      const std::map<std::string, double, std::less<>>& scalars,
                                      const std::vector<std::uint32_t>& crcs) {
  json scalar_values = json::object();
  for (const auto& [name, value] : scalars) scalar_values[name] = value;
  json checksums = json::object();
  for (std::size_t i = 0; i < plan.entries.size(); ++i) checksums[plan.entries[i].name] = hex32(crcs[i]);
  return {{"format", std::string(checkpoint_format)},
          {"format_version", std::to_string(checkpoint_format_version)},
          {"pscoro_version", PSCORO_VERSION_STRING},
          {"step", std::to_string(step)},
          {"scalars", scalar_values.dump()},
          {"slots", encode_slots(plan.slots).dump()},
          {"crc32c", checksums.dump()},
          {"header_crc32c", hex32(0)}};
}

// `header` (encode_header's: size and JSON) with its own checksum filled in.
std::string with_header_crc(std::string header) {
  const auto digits = header_crc_digits(std::string_view(header).substr(8));
  if (!digits) throw error(errc::internal, "checkpoint: the header has no place for its checksum");
  const auto crc = hex32(header_crc_of(std::string_view(header).substr(0, 8), header.substr(8), *digits));
  header.replace(8 + *digits, 8, crc);
  return header;
}

// Two buffers of a piece's size (at most 64 MiB), reused: one in a network transfer while the
// other is in a disk transfer.
std::array<byte_buffer, 2> piece_buffers(std::size_t chunk_bytes) {
  const std::size_t size = std::min(chunk_bytes, std::size_t{64} << 20);
  return {byte_buffer(size), byte_buffer(size)};
}

// The bytes of `piece`, received into `buffer` when it is large enough.
asio::awaitable<void> fetch_piece(const save_piece& piece, byte_buffer buffer, byte_buffer& out) {
  if (piece.source.name.empty()) {
    out = filled(piece.type, piece.bytes, piece.fill);
    co_return;
  }
  const byte_buffer into = buffer.size() >= piece.bytes ? buffer.slice(0, piece.bytes) : byte_buffer{};
  // Not a conditional expression: g++ 12 destroys a co_await's result twice inside one.
  tensor t;
  if (piece.rows) {
    t = co_await piece.io->read_rows(piece.source, piece.begin, piece.end, into);
  } else {
    t = co_await piece.io->read(piece.source, into);
  }
  if (t.size_bytes() != piece.bytes) {
    throw error(errc::protocol_error, fmt::format("checkpoint: '{}' answered {} bytes where {} were expected",
                                                  piece.source.name, t.size_bytes(), piece.bytes));
  }
  out = t.bytes();
}

// Blocking: runs on the checkpoint's I/O thread.
asio::awaitable<void> write_piece(const posix_file& file, byte_buffer bytes, std::uint64_t offset, std::uint32_t& crc) {
  crc = common::crc32c_extend(crc, bytes.data(), bytes.size());
  file.write_at(bytes.data(), bytes.size(), offset);
  co_return;
}

// One step of the pipeline: fetch piece k+1 while piece k is written on the I/O thread.
asio::awaitable<void> save_step(std::size_t task, asio::thread_pool& io_thread, const posix_file& file,
                                const save_piece* next, byte_buffer next_buffer, byte_buffer& next_out,
                                const byte_buffer& current, std::uint64_t offset, std::uint32_t& crc) {
  if (task == 0) {
    if (next) co_await fetch_piece(*next, std::move(next_buffer), next_out);
  } else {
    co_await asio::co_spawn(io_thread, write_piece(file, current, offset, crc), asio::use_awaitable);
  }
}

// Writes `pieces` to `file` from `offset` on, each fetched while the one before is written, and
// adds each to its tensor's checksum in `crcs`.
asio::awaitable<void> write_pieces(asio::thread_pool& io_thread, const posix_file& file,
                                   const std::vector<save_piece>& pieces, std::size_t chunk_bytes,
                                   std::uint64_t offset, std::vector<std::uint32_t>& crcs) {
  const auto buffers = piece_buffers(chunk_bytes);
  std::array<byte_buffer, 2> fetched;  // piece k's bytes in fetched[k % 2]
  if (!pieces.empty()) co_await fetch_piece(pieces[0], buffers[0], fetched[0]);
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const save_piece* next = k + 1 < pieces.size() ? &pieces[k + 1] : nullptr;
    auto& crc = crcs[pieces[k].entry];
    co_await detail::run_all(2, [&](std::size_t task) {
      return save_step(task, io_thread, file, next, buffers[(k + 1) % 2], fetched[(k + 1) % 2], fetched[k % 2],
                       offset, crc);
    });
    offset += pieces[k].bytes;
    fetched[k % 2] = {};
  }
}

// ---------------------------------------------------------------------------------------------
// Restore: every tensor checked first, then rows [begin, ...) of a shard (or slot) from `offset`
// in the file, read on the I/O thread while the piece before is sent.

// Blocking, on the I/O thread: the CRC-32C of `size` bytes of `file` from `offset`.
asio::awaitable<void> checksum_range(const posix_file& file, std::uint64_t offset, std::uint64_t size,
                                     std::uint32_t& crc) {
  std::vector<char> block(std::min<std::uint64_t>(size, 4 << 20));
  std::uint32_t c = 0;
  while (size > 0) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(size, block.size()));
    file.read_at(block.data(), n, offset);
    c = common::crc32c_extend(c, block.data(), n);
    offset += n;
    size -= n;
  }
  crc = c;
  co_return;
}

// Blocking, on the I/O thread: out.size() bytes of `file` from `offset` into `out`'s storage.
asio::awaitable<void> read_piece(const posix_file& file, std::uint64_t offset, byte_buffer out) {
  file.read_at(out.data(), out.size(), offset);
  co_return;
}

// A tensor of `type` and `shape` read from `offset` of `file` on the I/O thread.
asio::awaitable<tensor> read_tensor_at(asio::thread_pool& io_thread, const posix_file& file, std::uint64_t offset,
                                       dtype type, shape_type shape) {
  tensor value = tensor::uninitialized(type, std::move(shape));
  co_await asio::co_spawn(io_thread, read_piece(file, offset, value.bytes()), asio::use_awaitable);
  co_return value;
}

struct restore_piece {
  io_ptr io;
  variable_ref destination;
  std::uint64_t begin = 0;
  std::uint64_t offset = 0;
  shape_type rows;
};

// Reads `piece` from the file into `buffer` (when it is large enough) on the I/O thread.
asio::awaitable<tensor> load_piece(asio::thread_pool& io_thread, const posix_file& file, const restore_piece& piece,
                                   const byte_buffer& buffer) {
  const std::size_t bytes = num_elements(piece.rows) * size_of(piece.destination.type);
  tensor value(piece.destination.type, piece.rows, buffer.size() >= bytes ? buffer.slice(0, bytes) : byte_buffer(bytes));
  co_await asio::co_spawn(io_thread, read_piece(file, piece.offset, value.bytes()), asio::use_awaitable);
  co_return value;
}

// One step of the restore pipeline: send piece k while piece k+1 is read from the file.
asio::awaitable<void> restore_step(std::size_t task, asio::thread_pool& io_thread, const posix_file& file,
                                   const restore_piece& current, const tensor& current_value,
                                   const restore_piece* next, const byte_buffer& next_buffer, tensor& next_value) {
  if (task == 0) {
    co_await current.io->update_rows(current.destination, update_op::assign, current.begin, current_value);
  } else if (next) {
    next_value = co_await load_piece(io_thread, file, *next, next_buffer);
  }
}

// Sends `pieces` to their shards, the file read of one overlapping the send of the one before,
// through two reusable buffers (piece k in buffers[k % 2]; its send has completed before k + 2 is
// read).
asio::awaitable<void> send_pieces(asio::thread_pool& io_thread, const posix_file& file,
                                  const std::vector<restore_piece>& pieces, std::size_t chunk_bytes) {
  const auto buffers = piece_buffers(chunk_bytes);
  std::array<tensor, 2> in_flight;
  if (!pieces.empty()) in_flight[0] = co_await load_piece(io_thread, file, pieces[0], buffers[0]);
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const restore_piece* next = k + 1 < pieces.size() ? &pieces[k + 1] : nullptr;
    co_await detail::run_all(2, [&](std::size_t task) {
      return restore_step(task, io_thread, file, pieces[k], in_flight[k % 2], next, buffers[(k + 1) % 2],
                          in_flight[(k + 1) % 2]);
    });
    in_flight[k % 2] = tensor();
  }
}

// ---------------------------------------------------------------------------------------------
// Hash tables. A table's row count is known only once every part has sent its rows (training may
// insert meanwhile), so its rows are spooled to an unnamed file beside the checkpoint as they
// arrive, then copied into place once the header can be written.

// An unnamed temporary file in `directory` (O_TMPFILE; else a named one, unlinked at once): gone
// with its descriptor, whatever happens to the save.
class spool_file {
 public:
  explicit spool_file(const fs::path& directory) {
    const std::string dir = directory.empty() ? std::string(".") : directory.string();
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      std::string name = dir + "/.pscoro-spool-XXXXXX";
      fd_ = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd_ >= 0) ::unlink(name.c_str());
    }
    if (fd_ < 0) {
      throw error(errc::unavailable, fmt::format("checkpoint: cannot make a temporary file in {} for the hash "
                                                 "tables' rows: {}",
                                                 dir, std::strerror(errno)));
    }
  }
  ~spool_file() { ::close(fd_); }
  spool_file(const spool_file&) = delete;
  spool_file& operator=(const spool_file&) = delete;

  // Appends `size` bytes; returns where they went.
  std::uint64_t append(const void* data, std::size_t size) {
    const std::uint64_t at = size_;
    const auto* p = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size;) {
      const ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write");
      done += static_cast<std::size_t>(n);
    }
    size_ += size;
    return at;
  }
  void read_at(void* data, std::size_t size, std::uint64_t offset) const {
    auto* p = static_cast<char*>(data);
    for (std::size_t done = 0; done < size;) {
      const ssize_t n = ::pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("read");
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw error(errc::unavailable, fmt::format("checkpoint: {} of the hash tables' temporary file failed: {}", what,
                                               std::strerror(errno)));
  }
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// A run of a table tensor's bytes: spooled, or `bytes` of `fill` (slots of rows a part sent
// without them: it had no optimizer step yet).
struct table_run {
  std::uint64_t spooled_at = 0;
  std::uint64_t bytes = 0;
  std::optional<double> fill;
};

struct table_tensor {
  std::string name;
  dtype type = dtype::float32;
  std::size_t row_bytes = 0;  // bytes per row of the tensor
  std::vector<table_run> runs;
};

// What a save holds of a table before the file is planned.
struct spooled_table {
  std::string name;
  json record;                       // its __metadata__["tables"] entry
  std::uint64_t rows = 0;
  std::vector<table_tensor> tensors;  // rows, ids, last_named, slots..., [admission counters]
};

// The table's record: what a restore needs besides its tensors.
json table_record(const hash_table_ref& ref, const detail::table_state& state, std::uint64_t counters) {
  json record = {{"dim", ref.dim},
                 {"dtype", std::string(name_of(ref.type))},
                 {"buckets", ref.buckets},
                 {"clock", state.clock},
                 {"steps", state.steps},
                 {"admission_counters", counters},
                 {"optimizer", nullptr},
                 {"slots", json::array()}};
  if (state.owner) {
    std::string text;
    (void)google::protobuf::util::MessageToJsonString(wire::encode_optimizer(*state.owner), &text);
    record["optimizer"] = json::parse(text);
    for (const auto& slot : slots_of(*state.owner)) {
      record["slots"].push_back(fmt::format("{}/{}", optimizer_name(*state.owner), slot.name));
    }
  }
  return record;
}

// Reads every part of `table` in pieces of about `chunk_bytes` into `spool`: rows, ids, last-named
// times and slots each as runs of their tensor, the parts' states merged (the largest clock and
// step count; the counters' largest values, which never undercount an id, as the filter itself).
// Blocking, on the I/O thread: appends `size` bytes to `spool` as a run of a tensor.
asio::awaitable<void> spool_run(spool_file& spool, const void* data, std::size_t size, table_run& run) {
  run = {.spooled_at = spool.append(data, size), .bytes = size, .fill = std::nullopt};
  co_return;
}

// Appends `size` bytes to `spool` on the I/O thread, and their run to `runs`.
asio::awaitable<void> append_run(asio::thread_pool& io_thread, spool_file& spool, const void* data, std::size_t size,
                                 std::vector<table_run>& runs) {
  table_run run;
  co_await asio::co_spawn(io_thread, spool_run(spool, data, size, run), asio::use_awaitable);
  runs.push_back(run);
}

asio::awaitable<spooled_table> spool_table(asio::thread_pool& io_thread, const detail::checkpoint_table& t,
                                           std::size_t chunk_bytes, spool_file& spool,
                                           detail::variable_io::table_save save) {
  const auto& ref = t.ref;
  const std::size_t row_bytes = ref.dim * size_of(ref.type);
  spooled_table out;
  out.name = ref.name;
  detail::table_state merged;
  struct piece_runs {
    std::uint64_t rows;
    std::vector<table_run> runs;  // rows, ids, last_named, then each slot's (none: no slots)
  };
  std::vector<piece_runs> pieces;
  std::vector<table_run> dropped_runs;  // an increment's dropped ids
  std::vector<int> parts = ref.ps_tasks;
  std::sort(parts.begin(), parts.end());
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  std::vector<std::byte> column;
  for (const int ps : parts) {
    for (std::uint32_t first = 0; first < ref.buckets;) {
      const auto piece = co_await t.io->hash_export(ps, ref, first, chunk_bytes, save);
      if (piece.dropped.size() > 0) {
        co_await append_run(io_thread, spool, piece.dropped.bytes().data(), piece.dropped.size_bytes(), dropped_runs);
      }
      const auto& state = piece.state;
      merged.clock = std::max(merged.clock, state.clock);
      merged.steps = std::max(merged.steps, state.steps);
      if (state.owner && merged.owner && optimizer_name(*state.owner) != optimizer_name(*merged.owner)) {
        throw error(errc::failed_precondition,
                    fmt::format("checkpoint: hash table '{}' holds the slots of {} on one ps and of {} on another",
                                ref.name, optimizer_name(*merged.owner), optimizer_name(*state.owner)));
      }
      if (state.owner && !merged.owner) merged.owner = state.owner;
      if (!state.filter.empty()) {
        if (merged.filter.empty()) merged.filter.assign(state.filter.size(), 0);
        if (merged.filter.size() != state.filter.size()) {
          throw error(errc::failed_precondition,
                      fmt::format("checkpoint: hash table '{}' has admission filters of {} and {} counters on two ps",
                                  ref.name, merged.filter.size(), state.filter.size()));
        }
        for (std::size_t i = 0; i < state.filter.size(); ++i) {
          merged.filter[i] = std::max(merged.filter[i], state.filter[i]);
        }
      }
      const std::uint64_t n = piece.rows.ids.size();
      piece_runs runs{.rows = n, .runs = {}};
      if (n > 0) {
        const std::size_t columns = piece.rows.values.size_bytes() / (n * row_bytes);  // the row, then slots
        const auto* values = piece.rows.values.bytes().data();
        // The rows first, then ids and times, then each slot: every tensor's runs in one order.
        for (std::size_t c = 0; c < columns; ++c) {
          column.resize(n * row_bytes);
          for (std::uint64_t k = 0; k < n; ++k) {
            std::memcpy(column.data() + k * row_bytes, values + (k * columns + c) * row_bytes, row_bytes);
          }
          co_await append_run(io_thread, spool, column.data(), column.size(), runs.runs);
          if (c == 0) {
            co_await append_run(io_thread, spool, piece.rows.ids.bytes().data(), n * 8, runs.runs);
            co_await append_run(io_thread, spool, piece.rows.last_named.bytes().data(), n * 8, runs.runs);
          }
        }
      }
      pieces.push_back(std::move(runs));
      first = piece.next_bucket;
    }
  }
  const auto slots = merged.owner ? slots_of(*merged.owner) : std::vector<optimizer_slot>{};
  out.record = table_record(ref, merged, merged.filter.size());
  out.record["increment"] = save.base != 0;
  out.tensors.push_back({.name = ref.name, .type = ref.type, .row_bytes = row_bytes, .runs = {}});
  out.tensors.push_back({.name = ref.name + "/ids", .type = dtype::int64, .row_bytes = 8, .runs = {}});
  out.tensors.push_back({.name = ref.name + "/last_named", .type = dtype::int64, .row_bytes = 8, .runs = {}});
  for (const auto& slot : slots) {
    out.tensors.push_back({.name = fmt::format("{}/{}/{}", ref.name, optimizer_name(*merged.owner), slot.name),
                           .type = ref.type,
                           .row_bytes = row_bytes,
                           .runs = {}});
  }
  for (const auto& piece : pieces) {
    if (piece.rows == 0) continue;
    out.rows += piece.rows;
    for (std::size_t k = 0; k < 3; ++k) out.tensors[k].runs.push_back(piece.runs[k]);
    for (std::size_t s = 0; s < slots.size(); ++s) {
      const table_run fill{.spooled_at = 0, .bytes = piece.rows * row_bytes, .fill = slots[s].initial_value};
      out.tensors[3 + s].runs.push_back(piece.runs.size() > 3 + s ? piece.runs[3 + s] : fill);
    }
  }
  if (!merged.filter.empty()) {
    std::vector<std::byte> packed((merged.filter.size() + 7) / 8 * 8);
    std::memcpy(packed.data(), merged.filter.data(), merged.filter.size());
    out.tensors.push_back({.name = ref.name + "/admission_counters", .type = dtype::int64, .row_bytes = 8, .runs = {}});
    co_await append_run(io_thread, spool, packed.data(), packed.size(), out.tensors.back().runs);
  }
  if (save.base != 0) {
    out.tensors.push_back(
        {.name = ref.name + "/dropped", .type = dtype::int64, .row_bytes = 8, .runs = std::move(dropped_runs)});
  }
  co_return out;
}

// Table `t` into `spool` for save `save`: only what changed since `base` when that is not 0 and
// every part can tell (one that cannot, a ps restarted or a part never saved, makes the table go
// whole in this file).
asio::awaitable<spooled_table> spool_table_of_save(asio::thread_pool& io_thread, const detail::checkpoint_table& t,
                                                   std::size_t chunk_bytes, spool_file& spool, std::uint64_t save,
                                                   std::uint64_t base) {
  if (base != 0) {
    try {
      co_return co_await spool_table(io_thread, t, chunk_bytes, spool, {.save = save, .base = base});
    } catch (const error& e) {
      if (e.code() != errc::failed_precondition) throw;
      log::info("checkpoint: hash table '{}' is saved whole: {}", t.ref.name, e.what());
    }
  }
  co_return co_await spool_table(io_thread, t, chunk_bytes, spool, {.save = save, .base = 0});
}

// The file's entry of each of `table`'s tensors.
void plan_table(std::vector<safetensors::entry>& entries, const spooled_table& table) {
  for (const auto& t : table.tensors) {
    std::uint64_t bytes = 0;
    for (const auto& run : t.runs) bytes += run.bytes;
    shape_type shape{bytes / t.row_bytes};
    if (t.type != dtype::int64 || t.row_bytes != 8) shape.push_back(t.row_bytes / size_of(t.type));
    entries.push_back({.name = t.name, .type = t.type, .shape = std::move(shape)});
  }
}

// Blocking, on the I/O thread: copies every run of `t` from the spool (or its fill) to `file`
// from `offset`, and returns the tensor's CRC-32C.
asio::awaitable<void> write_table_tensor(const posix_file& file, const spool_file& spool, const table_tensor& t,
                                         std::uint64_t offset, std::uint32_t& crc) {
  constexpr std::size_t block = 4 << 20;
  std::vector<std::byte> buffer;
  std::uint32_t c = 0;
  for (const auto& run : t.runs) {
    for (std::uint64_t done = 0; done < run.bytes;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(block, run.bytes - done));
      if (run.fill) {
        const byte_buffer filled_bytes = filled(t.type, n, *run.fill);
        buffer.assign(filled_bytes.data(), filled_bytes.data() + n);
      } else {
        buffer.resize(n);
        spool.read_at(buffer.data(), n, run.spooled_at + done);
      }
      c = common::crc32c_extend(c, buffer.data(), n);
      file.write_at(buffer.data(), n, offset);
      offset += n;
      done += n;
    }
  }
  crc = c;
  co_return;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// checkpoint_reader

struct checkpoint_reader::state {
  fs::path path;
  std::unique_ptr<posix_file> file;
  safetensors::header header;
  std::map<std::string, std::size_t, std::less<>> index;  // name -> entry
  std::map<std::string, std::uint32_t, std::less<>> crcs;
  std::uint64_t save_id = 0;
  std::optional<checkpoint_reader::base_file> base;

  const safetensors::entry& find(std::string_view name) const {
    const auto it = index.find(name);
    if (it == index.end()) {
      throw error(errc::not_found, fmt::format("checkpoint {}: no tensor \"{}\"", path.string(), name));
    }
    return header.entries[it->second];
  }
};

checkpoint_reader::checkpoint_reader(fs::path path, checkpoint_read_options options)
    : state_(std::make_unique<state>()) {
  auto& s = *state_;
  s.path = std::move(path);
  s.file = std::make_unique<posix_file>(s.path, O_RDONLY, read_setting);
  const std::uint64_t file_size = s.file->size();
  std::string prefix(8, '\0');
  if (file_size >= 8) s.file->read_at(prefix.data(), 8, 0);
  const std::uint64_t n = safetensors::decode_header_size(s.path.string(), file_size >= 8 ? prefix : "", file_size);
  std::string text(n, '\0');
  s.file->read_at(text.data(), n, 8);
  s.header = safetensors::decode_header(s.path.string(), text, file_size);
  for (std::size_t i = 0; i < s.header.entries.size(); ++i) s.index.emplace(s.header.entries[i].name, i);

  const auto& metadata = s.header.metadata;
  const auto format = metadata.find("format");
  const bool ours = format != metadata.end() && format->second == checkpoint_format;
  // The header's own checksum first: a flipped byte anywhere in it (the version included) is damage.
  if (ours && metadata.contains("header_crc32c")) {
    const auto digits = header_crc_digits(text);
    const auto stated = digits ? parse_hex32(std::string_view(text).substr(*digits, 8)) : std::nullopt;
    if (!stated) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: the \"header_crc32c\" record is not as pscoro writes "
                                               "it (the header was rewritten?): its header cannot be verified",
                                               s.path.string()));
    }
    const auto actual = header_crc_of(prefix, text, *digits);
    if (actual != *stated) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: its header is corrupt (CRC-32C {} where the header "
                                               "says {})",
                                               s.path.string(), hex32(actual), hex32(*stated)));
    }
  }
  if (ours) {
    const auto version = metadata.find("format_version");
    int v = 0;
    if (version != metadata.end()) std::from_chars(version->second.data(), version->second.data() + version->second.size(), v);
    if (v < 1 || v > checkpoint_format_version) {
      throw error(errc::failed_precondition,
                  fmt::format("checkpoint {}: format version {} is not one this pscoro reads (1 to {})",
                              s.path.string(), version == metadata.end() ? "(none)" : version->second,
                              checkpoint_format_version));
    }
    // Since version 2 every save writes the header's checksum: without it, the header is unverified.
    if (v >= 2 && !metadata.contains("header_crc32c")) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: __metadata__ has no \"header_crc32c\" record, which "
                                               "every pscoro checkpoint of format version {} has: its header cannot "
                                               "be verified",
                                               s.path.string(), v));
    }
  }
  if (!ours && !options.allow_unverified) {
    throw error(errc::failed_precondition,
                fmt::format("checkpoint {}: not a pscoro checkpoint (its __metadata__ has no \"format\": \"{}\"; "
                            "written by another tool?), so nothing verifies its tensors; to read it unverified, "
                            "pass checkpoint_read_options{{.allow_unverified = true}}",
                            s.path.string(), checkpoint_format));
  }
  // A pscoro checkpoint is verified whole: a record missing, for the file or for one tensor, is
  // damage, not a file to read unchecked (a flipped byte would load as a wrong value).
  if (ours && !metadata.contains("crc32c")) {
    throw error(errc::data_loss, fmt::format("checkpoint {}: __metadata__ has no \"crc32c\" record, which every "
                                             "pscoro checkpoint has: its tensors cannot be verified",
                                             s.path.string()));
  }
  const json crcs = metadata_json(metadata, "crc32c", s.path.string());  // named: items() does not extend it
  for (const auto& [name, crc] : crcs.items()) {
    const auto value = crc.is_string() ? parse_hex32(crc.get<std::string>()) : std::nullopt;
    if (!value || !s.index.contains(name)) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: bad checksum record for \"{}\"", s.path.string(), name));
    }
    s.crcs.emplace(name, *value);
  }
  if (ours) {
    // The save's id, and for an increment the file it builds on.
    const auto malformed = [&](std::string_view what) {
      return error(errc::data_loss, fmt::format("checkpoint {}: {}", s.path.string(), what));
    };
    if (const auto id = metadata.find("save_id"); id != metadata.end()) {
      const auto value = parse_hex64(id->second);
      if (!value || *value == 0) throw malformed(fmt::format("save id \"{}\" is not 16 hex digits of a save", id->second));
      s.save_id = *value;
    }
    if (metadata.contains("base")) {
      const json base = metadata_json(metadata, "base", s.path.string());
      const std::uint64_t id = base.contains("save_id") && base["save_id"].is_string()
                                   ? parse_hex64(base["save_id"].get<std::string>()).value_or(0)
                                   : 0;
      if (!base.contains("file") || !base["file"].is_string() || base["file"].get<std::string>().empty() || id == 0 ||
          !base.contains("depth") || !base["depth"].is_number_unsigned() || base["depth"].get<std::uint64_t>() == 0 ||
          s.save_id == 0) {
        throw malformed("the \"base\" record is not as pscoro writes it");
      }
      s.base = base_file{.path = (s.path.parent_path() / base["file"].get<std::string>()).lexically_normal(),
                         .save_id = id,
                         .depth = static_cast<std::size_t>(base["depth"].get<std::uint64_t>())};
    }
  }
  std::size_t unverified = 0;
  for (const auto& e : s.header.entries) {
    if (s.crcs.contains(e.name)) continue;
    if (ours) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: tensor \"{}\" has no checksum in the \"crc32c\" "
                                               "record: it cannot be verified",
                                               s.path.string(), e.name));
    }
    ++unverified;
  }
  if (!ours) {
    log::warning("checkpoint {}: not a pscoro checkpoint, read unverified as asked ({} of its {} tensors have no "
                 "CRC-32C)",
                 s.path.string(), unverified, s.header.entries.size());
  }
}

checkpoint_reader::~checkpoint_reader() = default;
checkpoint_reader::checkpoint_reader(checkpoint_reader&&) noexcept = default;
checkpoint_reader& checkpoint_reader::operator=(checkpoint_reader&&) noexcept = default;

const fs::path& checkpoint_reader::path() const noexcept { return state_->path; }

std::vector<std::string> checkpoint_reader::names() const {
  std::vector<std::string> out;
  for (const auto& e : state_->header.entries) out.push_back(e.name);
  return out;
}

bool checkpoint_reader::contains(std::string_view name) const { return state_->index.contains(name); }
dtype checkpoint_reader::dtype(std::string_view name) const { return state_->find(name).type; }
const shape_type& checkpoint_reader::shape(std::string_view name) const { return state_->find(name).shape; }
const std::map<std::string, std::string, std::less<>>& checkpoint_reader::metadata() const {
  return state_->header.metadata;
}

std::int64_t checkpoint_reader::step() const {
  const auto it = metadata().find("step");
  if (it == metadata().end()) return 0;
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), step);
  if (ec != std::errc{} || end != it->second.data() + it->second.size()) {
    throw error(errc::data_loss, fmt::format("checkpoint {}: step \"{}\" is not an integer", path().string(), it->second));
  }
  return step;
}

std::map<std::string, double, std::less<>> checkpoint_reader::scalars() const {
  std::map<std::string, double, std::less<>> out;
  const json scalars = metadata_json(metadata(), "scalars", path().string());
  for (const auto& [name, value] : scalars.items()) {
    if (!value.is_number()) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: scalar \"{}\" is not a number", path().string(), name));
    }
    out.emplace(name, value.get<double>());
  }
  return out;
}

std::uint64_t checkpoint_reader::save_id() const noexcept { return state_->save_id; }

const std::optional<checkpoint_reader::base_file>& checkpoint_reader::base() const noexcept { return state_->base; }

tensor checkpoint_reader::read_tensor(std::string_view name) const {
  const auto& e = state_->find(name);
  tensor out = tensor::uninitialized(e.type, e.shape);
  if (e.size()) state_->file->read_at(out.bytes().data(), e.size(), state_->header.data_start + e.begin);
  if (const auto it = state_->crcs.find(name); it != state_->crcs.end()) {
    const auto crc = common::crc32c(out.bytes().data(), out.size_bytes());
    if (crc != it->second) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: tensor \"{}\" is corrupt (CRC-32C {} where the "
                                               "header says {})",
                                               path().string(), name, hex32(crc), hex32(it->second)));
    }
  }
  return out;
}

namespace detail {

struct checkpoint_reader_access {
  static const checkpoint_reader::state& of(const checkpoint_reader& reader) { return *reader.state_; }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Restore planning: what of the file goes where, checked before anything changes.

namespace {

// A tensor of the file and what it restores: a tracked variable, or one of its slots.
struct restore_target {
  const safetensors::entry* entry;
  const detail::checkpoint_variable* variable;
  const slot_record* slot;  // null for the variable itself
};

// Where target `t` goes on `shard`: the shard itself, or its slot (of `shape`) beside it.
variable_ref destination_of(const restore_target& t, const variable_ref& shard, shape_type shape) {
  if (!t.slot) return shard;
  return {shard.name + "/" + t.slot->suffix, t.entry->type, std::move(shape), shard.ps_task};
}

// The file's tensor of every tracked variable and of each of its slots; throws when one is
// missing or does not fit.
std::vector<restore_target> match_targets(const checkpoint_reader::state& state,
                                          const std::vector<detail::checkpoint_variable>& variables,
                                          const std::vector<slot_record>& slots, const std::string& where) {
  std::vector<restore_target> targets;
  for (const auto& v : variables) {
    if (!state.index.contains(v.ref.name)) {
      throw error(errc::not_found, fmt::format("checkpoint {}: no tensor for variable '{}'", where, v.ref.name));
    }
    const auto& e = state.find(v.ref.name);
    if (e.type != v.ref.type || e.shape != v.ref.shape) {
      throw error(errc::invalid_argument,
                  fmt::format("checkpoint {}: '{}' is {} {} in the file but {} {} here", where, v.ref.name,
                              name_of(e.type), to_string(e.shape), name_of(v.ref.type), to_string(v.ref.shape)));
    }
    targets.push_back({.entry = &e, .variable = &v, .slot = nullptr});
    for (const auto& s : slots) {
      if (s.variable != v.ref.name) continue;
      const auto& se = state.find(s.tensor);
      const bool fits = s.per_shard ? !se.shape.empty() : se.shape == v.ref.shape;
      if (!fits) {
        throw error(errc::data_loss, fmt::format("checkpoint {}: slot \"{}\" has shape {}, which does not fit '{}' {}",
                                                 where, s.tensor, to_string(se.shape), v.ref.name,
                                                 to_string(v.ref.shape)));
      }
      targets.push_back({.entry = &se, .variable = &v, .slot = &s});
    }
  }
  return targets;
}

struct slot_creation {
  const detail::checkpoint_variable* variable;
  variable_ref shard;
  variable_ref slot;
  double initial_value;
};

// The slots of `targets` that their shards do not hold yet; throws when one they hold has another
// dtype or shape than the file's.
asio::awaitable<std::vector<slot_creation>> missing_slots(const std::vector<restore_target>& targets,
                                                          const std::string& where, std::optional<int> only_ps = {}) {
  std::vector<slot_creation> creations;
  for (const auto& t : targets) {
    if (!t.slot) continue;
    for (const auto& shard : t.variable->ref.shards) {
      if (only_ps && shard.ps_task != *only_ps) continue;
      shape_type shape = shard.shape;
      if (t.slot->per_shard) shape.assign(t.entry->shape.begin() + 1, t.entry->shape.end());
      variable_ref slot = destination_of(t, shard, std::move(shape));
      bool exists = false;
      for (const auto& info : co_await t.variable->io->list_slots(shard)) {
        if (info.slot.name != slot.name) continue;
        if (info.slot.type != slot.type || info.slot.shape != slot.shape) {
          throw error(errc::invalid_argument,
                      fmt::format("checkpoint {}: slot '{}' exists as {} {} but the checkpoint holds {} {}", where,
                                  slot.name, name_of(info.slot.type), to_string(info.slot.shape),
                                  name_of(slot.type), to_string(slot.shape)));
        }
        exists = true;
      }
      if (!exists) {
        creations.push_back(
            {.variable = t.variable, .shard = shard, .slot = std::move(slot), .initial_value = t.slot->initial_value});
      }
    }
  }
  co_return creations;
}

// Every tensor of `targets` matches its checksum (read on the I/O thread).
asio::awaitable<void> verify_checksums(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                       const std::vector<restore_target>& targets, const std::string& where) {
  for (const auto& t : targets) {
    const auto crc = state.crcs.find(t.entry->name);
    if (crc == state.crcs.end()) continue;
    std::uint32_t actual = 0;
    const std::uint64_t offset = state.header.data_start + t.entry->begin;
    co_await asio::co_spawn(io_thread, checksum_range(*state.file, offset, t.entry->size(), actual),
                            asio::use_awaitable);
    if (actual != crc->second) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: tensor \"{}\" is corrupt (CRC-32C {} where the "
                                               "header says {}); nothing was restored",
                                               where, t.entry->name, hex32(actual), hex32(crc->second)));
    }
  }
}

// A slot stored per shard ([shards] + its shape): one to one when the shard count is the same, else
// the largest value for every shard (for a step count: the bias correction of the most advanced).
asio::awaitable<void> restore_per_shard_slot(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                             const restore_target& t, std::optional<int> only_ps) {
  const auto& ref = t.variable->ref;
  const std::size_t sources = t.entry->shape[0];
  const shape_type one(t.entry->shape.begin() + 1, t.entry->shape.end());
  const std::uint64_t offset = state.header.data_start + t.entry->begin;
  const tensor all = co_await read_tensor_at(io_thread, *state.file, offset, t.entry->type, t.entry->shape);
  const std::size_t bytes = num_elements(one) * size_of(t.entry->type);
  for (std::size_t i = 0; i < ref.shards.size(); ++i) {
    if (only_ps && ref.shards[i].ps_task != *only_ps) continue;
    tensor value = tensor::uninitialized(t.entry->type, one);
    if (sources == ref.shards.size()) {
      std::memcpy(value.bytes().data(), all.bytes().data() + i * bytes, bytes);
    } else {
      visit_dtype(t.entry->type, [&](auto zero) {
        using T = decltype(zero);
        const std::size_t n = num_elements(one);
        T* out = value.mutable_data<T>();
        const T* in = all.data<T>();
        for (std::size_t k = 0; k < n; ++k) {
          out[k] = in[k];
          for (std::size_t s = 1; s < sources; ++s) out[k] = std::max(out[k], in[s * n + k]);
        }
      });
    }
    const variable_ref slot = destination_of(t, ref.shards[i], one);
    co_await t.variable->io->update(slot, update_op::assign, value);
  }
}

// A scalar variable, or a slot of one: one element, to its one shard.
asio::awaitable<void> restore_scalar(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                     const restore_target& t, std::optional<int> only_ps) {
  if (only_ps && t.variable->ref.shards[0].ps_task != *only_ps) co_return;
  const std::uint64_t offset = state.header.data_start + t.entry->begin;
  const shape_type scalar;
  const tensor value = co_await read_tensor_at(io_thread, *state.file, offset, t.entry->type, scalar);
  const variable_ref destination = destination_of(t, t.variable->ref.shards[0], scalar);
  co_await t.variable->io->update(destination, update_op::assign, value);
}

// Every shard's rows of target `t`, in pieces of at most `chunk_bytes` (at least one row).
void add_restore_pieces(std::vector<restore_piece>& pieces, const checkpoint_reader::state& state,
                        const restore_target& t, std::size_t chunk_bytes, std::optional<int> only_ps) {
  const auto& ref = t.variable->ref;
  const std::uint64_t start = state.header.data_start + t.entry->begin;
  const std::size_t row_bytes = row_bytes_of(ref.shape, t.entry->type);
  const std::uint64_t per_piece = rows_per_piece(chunk_bytes, row_bytes);
  std::uint64_t first_row = 0;
  for (const auto& shard : ref.shards) {
    const variable_ref destination = destination_of(t, shard, shard.shape);
    for (std::uint64_t begin = 0; begin < shard.shape[0] && (!only_ps || shard.ps_task == *only_ps);
         begin += per_piece) {
      const std::uint64_t end = std::min<std::uint64_t>(shard.shape[0], begin + per_piece);
      shape_type rows = shard.shape;
      rows[0] = end - begin;
      pieces.push_back({.io = t.variable->io,
                        .destination = destination,
                        .begin = begin,
                        .offset = start + (first_row + begin) * row_bytes,
                        .rows = std::move(rows)});
    }
    first_row += shard.shape[0];
  }
}

// Applies checked `targets`: creates the missing slots, then moves every shard's rows from the
// file, a piece at a time; with `only_ps`, only the shards on that ps.
asio::awaitable<void> apply_restore(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                    const std::vector<restore_target>& targets,
                                    const std::vector<slot_creation>& creations, std::size_t chunk_bytes,
                                    std::optional<int> only_ps = {}) {
  for (const auto& c : creations) co_await c.variable->io->create_slot(c.shard, c.slot, c.initial_value);
  std::vector<restore_piece> pieces;
  for (const auto& t : targets) {
    if (t.slot && t.slot->per_shard) {
      co_await restore_per_shard_slot(io_thread, state, t, only_ps);
    } else if (t.variable->ref.shape.empty()) {
      co_await restore_scalar(io_thread, state, t, only_ps);
    } else {
      add_restore_pieces(pieces, state, t, chunk_bytes, only_ps);
    }
  }
  co_await send_pieces(io_thread, *state.file, pieces, chunk_bytes);
}

// A tracked table's tensors in the file, checked against its record.
struct table_target {
  const detail::checkpoint_table* table;
  detail::table_state state;  // its filter read in apply_table_restore
  std::uint64_t rows = 0;
  std::vector<const safetensors::entry*> columns;  // rows, then each slot: [rows, dim] each
  const safetensors::entry* ids = nullptr;
  const safetensors::entry* last_named = nullptr;
  const safetensors::entry* counters = nullptr;    // none without an admission filter
  std::uint64_t counter_count = 0;
};

// The file's tables: __metadata__["tables"], checked as pscoro writes it.
json tables_of(const checkpoint_reader::state& state, const std::string& where) {
  return metadata_json(state.header.metadata, "tables", where);
}

// The file's tensors of every tracked table; throws when one is missing or does not fit.
std::vector<table_target> match_tables(const checkpoint_reader::state& state,
                                       const std::vector<detail::checkpoint_table>& tables, const std::string& where) {
  const json records = tables_of(state, where);
  std::vector<table_target> targets;
  for (const auto& t : tables) {
    const auto& ref = t.ref;
    if (!records.contains(ref.name)) {
      throw error(errc::not_found, fmt::format("checkpoint {}: no hash table '{}'", where, ref.name));
    }
    const json& r = records[ref.name];
    const auto malformed = [&](std::string_view what) {
      return error(errc::data_loss, fmt::format("checkpoint {}: the record of hash table '{}' {}", where, ref.name, what));
    };
    if (!r.is_object() || !r.contains("dim") || !r["dim"].is_number_unsigned() || !r.contains("dtype") ||
        !r["dtype"].is_string() || !r.contains("clock") || !r["clock"].is_number_unsigned() || !r.contains("steps") ||
        !r["steps"].is_number_integer() || !r.contains("admission_counters") ||
        !r["admission_counters"].is_number_unsigned() || !r.contains("slots") || !r["slots"].is_array() ||
        !r.contains("optimizer")) {
      throw malformed("is malformed");
    }
    const auto dim = r["dim"].get<std::uint64_t>();
    if (r["dtype"].get<std::string>() != name_of(ref.type) || dim != ref.dim) {
      throw error(errc::invalid_argument,
                  fmt::format("checkpoint {}: hash table '{}' has rows of {} {} in the file but of {} {} here", where,
                              ref.name, dim, r["dtype"].get<std::string>(), ref.dim, name_of(ref.type)));
    }
    table_target target{.table = &t, .state = {}, .rows = 0, .columns = {}};
    target.state.clock = r["clock"].get<std::uint64_t>();
    target.state.steps = r["steps"].get<std::int64_t>();
    std::vector<std::string> slot_names;
    if (!r["optimizer"].is_null()) {
      wire::Optimizer opt;
      if (!google::protobuf::util::JsonStringToMessage(r["optimizer"].dump(), &opt).ok()) {
        throw malformed("has an optimizer pscoro does not read");
      }
      target.state.owner = wire::decode_optimizer(opt);
      for (const auto& slot : slots_of(*target.state.owner)) {
        slot_names.push_back(fmt::format("{}/{}", optimizer_name(*target.state.owner), slot.name));
      }
    }
    if (r["slots"] != json(slot_names)) throw malformed("lists other slots than its optimizer keeps");
    const auto tensor_of = [&](const std::string& name, dtype type, shape_type shape) {
      if (!state.index.contains(name)) throw malformed(fmt::format("names tensor \"{}\", which the file lacks", name));
      const auto& e = state.find(name);
      if (e.type != type || e.shape != shape) {
        throw malformed(fmt::format("needs \"{}\" as {} {}, the file holds {} {}", name, name_of(type),
                                    to_string(shape), name_of(e.type), to_string(e.shape)));
      }
      return &e;
    };
    if (!state.index.contains(ref.name + "/ids") || state.find(ref.name + "/ids").shape.size() != 1) {
      throw malformed(fmt::format("needs \"{}/ids\" as int64 [rows]", ref.name));
    }
    target.rows = state.find(ref.name + "/ids").shape[0];
    target.ids = tensor_of(ref.name + "/ids", dtype::int64, {target.rows});
    target.last_named = tensor_of(ref.name + "/last_named", dtype::int64, {target.rows});
    target.columns.push_back(tensor_of(ref.name, ref.type, {target.rows, ref.dim}));
    for (const auto& slot : slot_names) {
      target.columns.push_back(tensor_of(ref.name + "/" + slot, ref.type, {target.rows, ref.dim}));
    }
    target.counter_count = r["admission_counters"].get<std::uint64_t>();
    if (target.counter_count > (std::uint64_t{1} << 32)) throw malformed("has more than 2^32 admission counters");
    if (target.counter_count > 0) {
      target.counters = tensor_of(ref.name + "/admission_counters", dtype::int64, {(target.counter_count + 7) / 8});
    }
    targets.push_back(std::move(target));
  }
  return targets;
}

// Every tensor of `tables` matches its checksum.
asio::awaitable<void> verify_table_checksums(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                             const std::vector<table_target>& tables, const std::string& where) {
  std::vector<restore_target> targets;
  for (const auto& t : tables) {
    for (const auto* e : t.columns) targets.push_back({.entry = e, .variable = nullptr, .slot = nullptr});
    targets.push_back({.entry = t.ids, .variable = nullptr, .slot = nullptr});
    targets.push_back({.entry = t.last_named, .variable = nullptr, .slot = nullptr});
    if (t.counters) targets.push_back({.entry = t.counters, .variable = nullptr, .slot = nullptr});
  }
  co_await verify_checksums(io_thread, state, targets, where);
}

// Rows [begin, end) of tensor `e` (of `row_bytes` per row) from the file, on the I/O thread.
asio::awaitable<byte_buffer> read_table_rows(asio::thread_pool& io_thread, const checkpoint_reader::state& state,
                                             const safetensors::entry& e, std::size_t row_bytes, std::uint64_t begin,
                                             std::uint64_t end) {
  byte_buffer out((end - begin) * row_bytes);
  co_await asio::co_spawn(io_thread, read_piece(*state.file, state.header.data_start + e.begin + begin * row_bytes, out),
                          asio::use_awaitable);
  co_return out;
}

// One file of a table's restore: the table's tensors there, and for an increment its dropped ids.
struct table_link {
  std::shared_ptr<checkpoint_reader> reader;  // keeps the file open
  table_target target;
  const safetensors::entry* dropped = nullptr;  // an increment's
};

// The files table `t` restores from, its last whole save first and `last` last: each increment's
// base opened beside it and checked to be the save it was built on. Throws errc::data_loss naming
// the file when one is missing, replaced, or not as pscoro writes it.
std::vector<table_link> chain_of(std::shared_ptr<checkpoint_reader> last, const detail::checkpoint_table& t) {
  std::vector<table_link> chain;
  std::set<fs::path> seen;
  for (auto reader = std::move(last);;) {
    const auto& state = detail::checkpoint_reader_access::of(*reader);
    const std::string where = state.path.string();
    if (!seen.insert(state.path.lexically_normal()).second) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: its chain of increments comes back to it", where));
    }
    const std::vector<detail::checkpoint_table> one{t};
    const json records = tables_of(state, where);
    if (!chain.empty() && !records.contains(t.ref.name)) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: hash table '{}' is not in it, and {} builds on it for "
                                               "that table",
                                               where, t.ref.name, chain.back().reader->path().string()));
    }
    table_link link{.reader = reader, .target = std::move(match_tables(state, one, where).front()), .dropped = nullptr};
    link.target.table = &t;
    const json& record = records[t.ref.name];
    const bool increment = record.contains("increment") && record["increment"].is_boolean() &&
                           record["increment"].get<bool>();
    if (increment) {
      const std::string name = t.ref.name + "/dropped";
      if (!state.index.contains(name) || state.find(name).type != dtype::int64 || state.find(name).shape.size() != 1) {
        throw error(errc::data_loss, fmt::format("checkpoint {}: hash table '{}' is an increment without \"{}\" as "
                                                 "int64 [ids]",
                                                 where, t.ref.name, name));
      }
      link.dropped = &state.find(name);
    }
    chain.insert(chain.begin(), std::move(link));
    if (!increment) break;
    if (!reader->base()) {
      throw error(errc::data_loss, fmt::format("checkpoint {}: hash table '{}' is an increment, and the file names "
                                               "no base",
                                               where, t.ref.name));
    }
    const auto& base = *reader->base();
    std::error_code missing;
    if (!fs::exists(base.path, missing)) {
      throw error(errc::data_loss, fmt::format("checkpoint {} builds on {}, which is missing: its hash table '{}' "
                                               "cannot be restored (a whole save or an earlier file can be)",
                                               where, base.path.string(), t.ref.name));
    }
    auto next = std::make_shared<checkpoint_reader>(base.path);
    if (next->save_id() != base.save_id) {
      throw error(errc::data_loss, fmt::format("checkpoint {} builds on save {} of {}, which holds save {} now (it was "
                                               "replaced): its hash table '{}' cannot be restored",
                                               where, hex64(base.save_id), base.path.string(),
                                               hex64(next->save_id()), t.ref.name));
    }
    reader = std::move(next);
  }
  // One optimizer along the chain: a file before the first step has none.
  const auto& final_owner = chain.back().target.state.owner;
  for (const auto& link : chain) {
    const auto& owner = link.target.state.owner;
    if (owner && (!final_owner || optimizer_name(*owner) != optimizer_name(*final_owner))) {
      throw error(errc::data_loss,
                  fmt::format("checkpoint {}: hash table '{}' holds the slots of {} there and of {} in {}",
                              link.reader->path().string(), t.ref.name, optimizer_name(*owner),
                              final_owner ? optimizer_name(*final_owner) : std::string_view("no optimizer"),
                              chain.back().reader->path().string()));
    }
  }
  return chain;
}

// Every tensor of the chain matches its checksum.
asio::awaitable<void> verify_chain(asio::thread_pool& io_thread, const std::vector<table_link>& chain) {
  for (const auto& link : chain) {
    const auto& state = detail::checkpoint_reader_access::of(*link.reader);
    const std::vector<table_target> one{link.target};
    co_await verify_table_checksums(io_thread, state, one, state.path.string());
    if (link.dropped) {
      const std::vector<restore_target> dropped{{.entry = link.dropped, .variable = nullptr, .slot = nullptr}};
      co_await verify_checksums(io_thread, state, dropped, state.path.string());
    }
  }
}

// Rows for the ps at `index` in ref.ps_tasks, if there are any.
asio::awaitable<void> import_rows(detail::variable_io& io, const hash_table_ref& ref, std::size_t index,
                                  detail::variable_io::table_import import) {
  if (import.rows.ids.size() > 0 || !import.dropped.empty()) {
    co_await io.hash_import(ref.ps_tasks[index], ref, std::move(import));
  }
}

// Sends the rows of `link` to the ps of their buckets in pieces of about `chunk_bytes`, each with
// `columns` rows of values (the row, then the slots: a file saved before the first step has none,
// and its rows get the slots' initial values); an increment's dropped ids first, and its rows
// replace those held.
asio::awaitable<void> send_link(asio::thread_pool& io_thread, const table_link& link, const detail::checkpoint_table& t,
                                const std::vector<double>& slot_initial_values, std::size_t chunk_bytes,
                                std::optional<int> only_ps) {
  const auto& ref = t.ref;
  const auto& state = detail::checkpoint_reader_access::of(*link.reader);
  const std::size_t row_bytes = ref.dim * size_of(ref.type);
  const std::size_t columns = 1 + slot_initial_values.size();
  const std::size_t n_ps = ref.ps_tasks.size();
  const auto rows_of = [&](std::size_t n) {
    return detail::variable_io::table_rows{tensor::uninitialized(dtype::int64, {n}),
                                           tensor::uninitialized(dtype::int64, {n}),
                                           tensor::uninitialized(ref.type, {n, columns * ref.dim})};
  };
  const bool increment = link.dropped != nullptr;
  if (increment) {
    const std::uint64_t dropped = link.dropped->shape[0];
    const std::uint64_t per_piece = rows_per_piece(chunk_bytes, 8);
    for (std::uint64_t begin = 0; begin < dropped; begin += per_piece) {
      const std::uint64_t end = std::min(dropped, begin + per_piece);
      const auto bytes = co_await read_table_rows(io_thread, state, *link.dropped, 8, begin, end);
      std::vector<std::vector<std::int64_t>> by_ps(n_ps);
      for (std::uint64_t k = 0; k < end - begin; ++k) {
        std::int64_t id = 0;
        std::memcpy(&id, bytes.data() + k * 8, 8);
        const std::size_t p = common::ps_index_of(id, ref);
        if (!only_ps || ref.ps_tasks[p] == *only_ps) by_ps[p].push_back(id);
      }
      co_await detail::run_all(n_ps, [&](std::size_t p) {
        return import_rows(*t.io, ref, p, {.reset = std::nullopt, .dropped = std::move(by_ps[p]), .rows = rows_of(0),
                                           .replace = false});
      });
    }
  }
  const auto& target = link.target;
  const std::uint64_t per_piece = rows_per_piece(chunk_bytes, columns * row_bytes + 16);
  for (std::uint64_t begin = 0; begin < target.rows; begin += per_piece) {
    const std::uint64_t end = std::min(target.rows, begin + per_piece);
    const std::size_t n = end - begin;
    const auto ids_bytes = co_await read_table_rows(io_thread, state, *target.ids, 8, begin, end);
    const auto named_bytes = co_await read_table_rows(io_thread, state, *target.last_named, 8, begin, end);
    std::vector<byte_buffer> column_bytes;
    for (std::size_t c = 0; c < columns; ++c) {
      if (c < target.columns.size()) {
        auto column = co_await read_table_rows(io_thread, state, *target.columns[c], row_bytes, begin, end);
        column_bytes.push_back(std::move(column));
      } else {
        column_bytes.push_back(filled(ref.type, n * row_bytes, slot_initial_values[c - 1]));
      }
    }
    std::vector<std::int64_t> ids(n);
    std::memcpy(ids.data(), ids_bytes.data(), n * 8);
    // Each row to the ps of its bucket, in file order.
    const auto wanted = [&](std::size_t p) { return !only_ps || ref.ps_tasks[p] == *only_ps; };
    std::vector<std::size_t> count(n_ps, 0);
    for (const std::int64_t id : ids) ++count[common::ps_index_of(id, ref)];
    std::vector<detail::variable_io::table_rows> out;
    for (std::size_t p = 0; p < n_ps; ++p) out.push_back(rows_of(wanted(p) ? count[p] : 0));
    std::vector<std::size_t> filled_rows(n_ps, 0);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t p = common::ps_index_of(ids[k], ref);
      if (!wanted(p)) continue;
      const std::size_t at = filled_rows[p]++;
      std::memcpy(out[p].ids.bytes().data() + at * 8, ids_bytes.data() + k * 8, 8);
      std::memcpy(out[p].last_named.bytes().data() + at * 8, named_bytes.data() + k * 8, 8);
      for (std::size_t c = 0; c < columns; ++c) {
        std::memcpy(out[p].values.bytes().data() + (at * columns + c) * row_bytes, column_bytes[c].data() + k * row_bytes,
                    row_bytes);
      }
    }
    co_await detail::run_all(n_ps, [&](std::size_t p) {
      return import_rows(*t.io, ref, p, {.reset = std::nullopt, .dropped = {}, .rows = std::move(out[p]),
                                         .replace = increment});
    });
  }
}

// Replaces the rows of table `t`'s parts with those of `chain` (chain_of's): each part reset to the
// last file's state, then the files' rows in order (an increment's dropped ids before its rows),
// each row to the ps that holds its bucket now.
asio::awaitable<void> apply_table_restore(asio::thread_pool& io_thread, const std::vector<table_link>& chain,
                                          const detail::checkpoint_table& t, std::size_t chunk_bytes,
                                          std::optional<int> only_ps = {}) {
  const auto& ref = t.ref;
  const auto& last = chain.back();
  detail::table_state reset = last.target.state;
  reset.save = last.reader->save_id();
  if (last.target.counters) {
    const auto packed = co_await read_table_rows(io_thread, detail::checkpoint_reader_access::of(*last.reader), *last.target.counters,
                                                 last.target.counters->size(), 0, 1);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(packed.data());
    reset.filter.assign(bytes, bytes + last.target.counter_count);
  }
  std::vector<double> slot_initial_values;
  if (reset.owner) {
    for (const auto& slot : slots_of(*reset.owner)) slot_initial_values.push_back(slot.initial_value);
  }
  std::vector<int> parts = ref.ps_tasks;
  std::sort(parts.begin(), parts.end());
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  if (only_ps) std::erase_if(parts, [&](int ps) { return ps != *only_ps; });
  const std::size_t columns = 1 + slot_initial_values.size();
  co_await detail::run_all(parts.size(), [&](std::size_t p) {
    return t.io->hash_import(parts[p], ref,
                             {.reset = reset,
                              .dropped = {},
                              .rows = {tensor::uninitialized(dtype::int64, {0}), tensor::uninitialized(dtype::int64, {0}),
                                       tensor::uninitialized(ref.type, {0, columns * ref.dim})},
                              .replace = false});
  });
  for (const auto& link : chain) co_await send_link(io_thread, link, t, slot_initial_values, chunk_bytes, only_ps);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The checkpoint's state: the tracked variables, and the values a restore left for variables that
// did not exist yet, which the strategy's placement hands to each variable it creates.

namespace detail {

struct checkpoint_state final : chief::restore_on_create {
  // A restored file's variables that no variable has taken yet.
  struct pending_file {
    std::string path;
    std::shared_ptr<checkpoint_reader> reader;  // open: a pending value is read at its creation
    std::vector<checkpoint_slot_record> slots;
    std::set<std::string, std::less<>> names;
    std::set<std::string, std::less<>> tables;  // the names of `names` that are hash tables
  };

  std::vector<checkpoint_variable> variables;
  std::vector<checkpoint_table> tables;
  std::size_t chunk_bytes = 32 << 20;
  std::weak_ptr<coordinator_core> core;  // set when made with a strategy
  std::shared_ptr<pending_file> pending;
  std::optional<saved_file> last_file;  // written or restored last

  /// While the strategy's chief restores a lost ps, its variables are not all there: a save or a
  /// restore waits for that first (checked every 50 ms; a ps lost during a save fails it).
  asio::awaitable<void> wait_for_ps_restores() const {
    const auto chief = core.lock();
    if (!chief || !chief->restoring_ps()) co_return;
    asio::steady_timer nap(co_await asio::this_coro::executor);
    while (chief->restoring_ps()) {
      nap.expires_after(std::chrono::milliseconds(50));
      co_await nap.async_wait(asio::use_awaitable);
    }
  }
  // Variables claimed and being created: the file they take their value from (a restore() in the
  // meantime replaces `pending`, not what they were promised).
  std::map<std::string, std::shared_ptr<pending_file>, std::less<>> claimed;

  void track(sharded_variable_ref ref, std::shared_ptr<variable_io> io) {
    for (auto& t : variables) {
      if (t.ref.name != ref.name) continue;
      if (t.ref == ref) return;  // the same variable
      throw error(errc::already_exists, fmt::format("checkpoint: a variable named '{}' is tracked already", ref.name));
    }
    refuse_table_named(ref.name);
    variables.push_back({std::move(ref), std::move(io)});
  }

  void track(hash_table_ref ref, std::shared_ptr<variable_io> io) {
    for (auto& t : tables) {
      if (t.ref.name != ref.name) continue;
      if (t.ref == ref) return;  // the same table
      throw error(errc::already_exists, fmt::format("checkpoint: a hash table named '{}' is tracked already", ref.name));
    }
    for (auto& v : variables) {
      if (v.ref.name == ref.name) {
        throw error(errc::already_exists, fmt::format("checkpoint: a variable named '{}' is tracked already", ref.name));
      }
    }
    tables.push_back({std::move(ref), std::move(io)});
  }

  void refuse_table_named(const std::string& name) const {
    for (auto& t : tables) {
      if (t.ref.name == name) {
        throw error(errc::already_exists, fmt::format("checkpoint: a hash table named '{}' is tracked already", name));
      }
    }
  }

  asio::awaitable<bool> claims(const std::string& name, dtype type, const shape_type& shape) override {
    const auto file = pending;  // held: a restore() while this awaits replaces `pending`
    if (!file || !file->reader || !file->names.contains(name) || file->tables.contains(name)) co_return false;
    const auto& state = *file->reader->state_;
    const std::string where = state.path.string();
    const auto& e = state.find(name);
    if (e.type != type || e.shape != shape) {
      throw error(errc::invalid_argument,
                  fmt::format("variable '{}' is created as {} {} but checkpoint {} (restored before it existed) "
                              "holds it as {} {}",
                              name, name_of(type), to_string(shape), where, name_of(e.type), to_string(e.shape)));
    }
    const std::vector<checkpoint_variable> one{{sharded_variable_ref{name, type, shape, {}}, nullptr}};
    const auto targets = match_targets(state, one, file->slots, where);
    asio::thread_pool io_thread(1);
    co_await verify_checksums(io_thread, state, targets, where);
    claimed[name] = file;
    co_return true;
  }

  asio::awaitable<void> restore(const sharded_variable_ref& ref, std::shared_ptr<variable_io> io) override {
    const auto it = claimed.find(ref.name);
    if (it == claimed.end()) {
      throw error(errc::internal, fmt::format("checkpoint: '{}' was not claimed before its restore", ref.name));
    }
    const auto file = std::move(it->second);
    claimed.erase(it);
    const auto& state = *file->reader->state_;
    const std::string where = state.path.string();
    const std::vector<checkpoint_variable> one{{ref, io}};
    const auto targets = match_targets(state, one, file->slots, where);
    const auto creations = co_await missing_slots(targets, where);
    asio::thread_pool io_thread(1);
    co_await apply_restore(io_thread, state, targets, creations, chunk_bytes);
    file->names.erase(ref.name);
    if (pending == file && file->names.empty()) pending.reset();  // nothing left to read: close it
    track(ref, std::move(io));
  }

  asio::awaitable<bool> claims_table(const hash_table_ref& ref) override {
    const auto file = pending;  // held: a restore() while this awaits replaces `pending`
    if (!file || !file->reader || !file->tables.contains(ref.name)) co_return false;
    const checkpoint_table table{ref, nullptr};
    const auto chain = chain_of(file->reader, table);
    asio::thread_pool io_thread(1);
    co_await verify_chain(io_thread, chain);
    claimed[ref.name] = file;
    co_return true;
  }

  asio::awaitable<void> restore_table(const hash_table_ref& ref, std::shared_ptr<variable_io> io) override {
    const auto it = claimed.find(ref.name);
    if (it == claimed.end()) {
      throw error(errc::internal, fmt::format("checkpoint: hash table '{}' was not claimed before its restore", ref.name));
    }
    const auto file = std::move(it->second);
    claimed.erase(it);
    const checkpoint_table table{ref, io};
    const auto chain = chain_of(file->reader, table);
    asio::thread_pool io_thread(1);
    co_await apply_table_restore(io_thread, chain, table, chunk_bytes);
    file->names.erase(ref.name);
    file->tables.erase(ref.name);
    if (pending == file && file->names.empty()) pending.reset();  // nothing left to read: close it
    track(ref, std::move(io));
  }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// checkpoint

checkpoint::checkpoint() : state_(std::make_shared<detail::checkpoint_state>()) {}

checkpoint::checkpoint(const parameter_server_strategy& strategy) : checkpoint() { state_->core = strategy.core(); }

checkpoint::~checkpoint() = default;
checkpoint::checkpoint(checkpoint&&) noexcept = default;
checkpoint& checkpoint::operator=(checkpoint&&) noexcept = default;

void checkpoint::set_chunk_bytes(std::size_t bytes) noexcept { state_->chunk_bytes = bytes ? bytes : 1; }

checkpoint& checkpoint::track_ref(sharded_variable_ref ref, std::shared_ptr<detail::variable_io> io) {
  if (!io) throw error(errc::failed_precondition, fmt::format("checkpoint: variable '{}' is not bound", ref.name));
  state_->track(std::move(ref), std::move(io));
  return *this;
}

checkpoint& checkpoint::track_table(hash_table_ref ref, std::shared_ptr<detail::variable_io> io) {
  if (!io) throw error(errc::failed_precondition, fmt::format("checkpoint: hash table '{}' is not bound", ref.name));
  state_->track(std::move(ref), std::move(io));
  return *this;
}

std::vector<std::string> checkpoint::pending() const {
  if (!state_->pending) return {};
  return {state_->pending->names.begin(), state_->pending->names.end()};
}

void checkpoint::assert_consumed() const {
  const auto names = pending();
  if (names.empty()) return;
  constexpr std::size_t shown = 10;
  std::string list;
  for (std::size_t i = 0; i < std::min(names.size(), shown); ++i) list += fmt::format("{}'{}'", i ? ", " : "", names[i]);
  if (names.size() > shown) list += fmt::format(" and {} more", names.size() - shown);
  throw error(errc::failed_precondition,
              fmt::format("checkpoint {}: {} saved variable{} not restored into any variable: {}",
                          state_->pending->path, names.size(), names.size() == 1 ? " was" : "s were",
                          list));
}

void checkpoint::discard_pending() { state_->pending.reset(); }

void checkpoint::set_scalar(std::string name, double value) { scalars_[std::move(name)] = value; }

double checkpoint::scalar(std::string_view name) const {
  const auto it = scalars_.find(name);
  if (it == scalars_.end()) throw error(errc::not_found, fmt::format("checkpoint: no scalar '{}'", name));
  return it->second;
}

asio::awaitable<void> checkpoint::save(fs::path path, checkpoint_save_options options) const {
  // A FIFO or a directory there is refused now, not found by the rename after the whole save.
  (void)common::regular_file_exists("checkpoint", path.string(), save_setting);
  // Held by this frame: the state may be replaced (a move-assignment) while it awaits.
  const auto self = state_;
  co_await self->wait_for_ps_restores();
  // One I/O thread writes the file for the whole save: the executor never waits on the disk.
  asio::thread_pool io_thread(1);
  // The tables first, into the spool: their row counts decide the file's shape. An incremental
  // save builds on the last file this checkpoint wrote or restored.
  const std::size_t chunk_bytes = self->chunk_bytes;
  const std::uint64_t save_id = new_save_id();
  const std::optional<detail::saved_file> base =
      options.incremental && self->last_file && self->last_file->save_id != 0 ? self->last_file : std::nullopt;
  std::optional<spool_file> spool;
  std::vector<spooled_table> tables;
  if (!self->tables.empty()) spool.emplace(path.parent_path());
  bool increment = false;  // whether a table of the file needs its base
  for (const auto& t : self->tables) {
    tables.push_back(
        co_await spool_table_of_save(io_thread, t, chunk_bytes, *spool, save_id, base ? base->save_id : 0));
    increment = increment || tables.back().record["increment"].get<bool>();
  }
  const std::size_t depth = increment ? base->depth + 1 : 0;
  // Plan the file: every variable, then its slots (found on each shard's ps), as pieces in order;
  // then every table's tensors.
  save_plan plan;
  for (const auto& v : self->variables) {
    plan_variable(plan, v, chunk_bytes);
    const auto found = co_await find_slots(v);
    for (const auto& [suffix, per_shard] : found) plan_slot(plan, v, suffix, per_shard, chunk_bytes);
  }
  const std::size_t first_table_entry = plan.entries.size();
  json table_records = json::object();
  for (const auto& t : tables) {
    plan_table(plan.entries, t);
    table_records[t.name] = t.record;
  }
  std::set<std::string_view> names;
  for (const auto& e : plan.entries) {
    if (!names.insert(e.name).second) {
      throw error(errc::already_exists,
                  fmt::format("checkpoint: two tensors would be named \"{}\" (a variable, a slot or a hash table's)",
                              e.name));
    }
  }
  std::vector<std::uint32_t> crcs(plan.entries.size(), 0);
  const auto metadata = [&] {
    auto m = metadata_of(plan, step_, scalars_, crcs);
    if (!tables.empty()) m["tables"] = table_records.dump();
    m["save_id"] = hex64(save_id);
    if (increment) {
      // The base by its path from this file's directory: the two may move together.
      const fs::path from = fs::absolute(path).parent_path().lexically_normal();
      const fs::path relative = fs::absolute(base->path).lexically_normal().lexically_relative(from);
      m["base"] = json{{"file", relative.string()}, {"save_id", hex64(base->save_id)}, {"depth", depth}}.dump();
    }
    return m;
  };
  const std::string placeholder = safetensors::encode_header(plan.entries, metadata());

  // Write a temporary file beside the target, then rename it into place.
  const fs::path temporary = path.string() + fmt::format(".tmp-{}", ::getpid());
  struct remove_on_failure {
    const fs::path& path;
    bool armed = true;
    ~remove_on_failure() {
      std::error_code ignored;
      if (armed) fs::remove(path, ignored);
    }
  } cleanup{temporary};
  posix_file file(temporary, O_WRONLY | O_CREAT | O_TRUNC, save_setting);
  file.write_at(placeholder.data(), placeholder.size(), 0);
  const std::uint64_t data_start = placeholder.size();
  co_await write_pieces(io_thread, file, plan.pieces, chunk_bytes, data_start, crcs);
  std::size_t entry = first_table_entry;
  for (const auto& t : tables) {
    for (const auto& tensor : t.tensors) {
      co_await asio::co_spawn(io_thread,
                              write_table_tensor(file, *spool, tensor, data_start + plan.entries[entry].begin, crcs[entry]),
                              asio::use_awaitable);
      ++entry;
    }
  }
  const std::string header = with_header_crc(safetensors::encode_header(plan.entries, metadata()));
  if (header.size() != placeholder.size()) {
    throw error(errc::internal, "checkpoint: the header changed size when its checksums were filled in");
  }
  file.write_at(header.data(), header.size(), 0);
  file.sync();
  file.close();
  fs::rename(temporary, path);
  cleanup.armed = false;
  sync_directory(path.parent_path());
  self->last_file = detail::saved_file{.path = path, .save_id = save_id, .depth = depth};
}

asio::awaitable<void> checkpoint::restore(fs::path path, checkpoint_read_options options) {
  // Held by this frame: the state may be replaced (a move-assignment) while it awaits.
  const auto self = state_;
  co_await self->wait_for_ps_restores();
  auto reader = std::make_shared<checkpoint_reader>(path, options);
  const auto& state = *reader->state_;
  const std::string where = path.string();
  auto slots = decode_slots(metadata_json(state.header.metadata, "slots", where), where);

  // Check everything before anything changes.
  const auto targets = match_targets(state, self->variables, slots, where);
  std::vector<std::vector<table_link>> chains;  // each tracked table's files, an increment's bases first
  for (const auto& t : self->tables) chains.push_back(chain_of(reader, t));
  const auto creations = co_await missing_slots(targets, where);
  // One I/O thread reads the file for the whole restore: the executor never waits on the disk.
  asio::thread_pool io_thread(1);
  co_await verify_checksums(io_thread, state, targets, where);
  for (const auto& chain : chains) co_await verify_chain(io_thread, chain);
  co_await apply_restore(io_thread, state, targets, creations, self->chunk_bytes);
  for (std::size_t i = 0; i < chains.size(); ++i) {
    co_await apply_table_restore(io_thread, chains[i], self->tables[i], self->chunk_bytes);
  }
  step_ = reader->step();
  scalars_ = reader->scalars();
  // The next incremental save builds on this file (its tables' parts know it by its id now).
  self->last_file = detail::saved_file{
      .path = path, .save_id = reader->save_id(), .depth = reader->base() ? reader->base()->depth : 0};

  // The file's variables that no tracked one took wait for variables created later (its slots go
  // with their variables).
  auto file = std::make_shared<detail::checkpoint_state::pending_file>();
  std::set<std::string, std::less<>> slot_tensors;
  for (const auto& s : slots) slot_tensors.insert(s.tensor);
  // A table's tensors are its own: the table is pending, not each of them.
  const json table_records = tables_of(state, where);
  for (const auto& item : table_records.items()) {
    const std::string name = item.key();  // named: clang's lambdas cannot capture a binding
    const bool tracked = std::any_of(self->tables.begin(), self->tables.end(),
                                     [&](const auto& t) { return t.ref.name == name; });
    if (!tracked) {
      file->names.insert(name);
      file->tables.insert(name);
    }
  }
  std::set<std::string, std::less<>> table_tensors;
  for (const auto& [name, record] : table_records.items()) {
    for (const char* suffix : {"", "/ids", "/last_named", "/admission_counters", "/dropped"}) {
      table_tensors.insert(name + suffix);
    }
    if (record.is_object() && record.contains("slots") && record["slots"].is_array()) {
      for (const auto& slot : record["slots"]) {
        if (slot.is_string()) table_tensors.insert(name + "/" + slot.get<std::string>());
      }
    }
  }
  const auto of_a_table = [&](const std::string& tensor) { return table_tensors.contains(tensor); };
  for (const auto& e : state.header.entries) {
    if (slot_tensors.contains(e.name) || of_a_table(e.name)) continue;
    const bool tracked = std::any_of(self->variables.begin(), self->variables.end(),
                                     [&](const auto& v) { return v.ref.name == e.name; });
    if (!tracked) file->names.insert(e.name);
  }
  self->pending.reset();
  if (file->names.empty()) co_return;
  const auto core = self->core.lock();
  if (core) {
    file->reader = std::move(reader);
    file->slots = std::move(slots);
    core->add_restorer(self);
  }  // else nothing will create them: the names only (pending() lists them), not the open file
  file->path = where;
  self->pending = std::move(file);
}

// ---------------------------------------------------------------------------------------------
// Restoring a lost ps in place

namespace detail {

class lost_ps_recovery final : public chief::lost_ps_restorer {
 public:
  lost_ps_recovery(std::weak_ptr<checkpoint_state> state, fs::path directory, ps_restore_options options)
      : state_(std::move(state)), directory_(std::move(directory)), options_(std::move(options)) {}

  std::chrono::milliseconds wait_for_ps() const override { return options_.wait_for_ps; }

  asio::awaitable<restored> restore_ps(int ps_task, const std::vector<std::string>& variables,
                                       const std::vector<std::string>& tables) override {
    const auto self = state_.lock();
    const std::string ps = fmt::format("ps:{}", ps_task);
    if (!self) throw error(errc::failed_precondition, fmt::format("{} was lost and its checkpoint is gone", ps));
    const auto latest = latest_checkpoint(directory_);
    if (!latest) {
      throw error(errc::failed_precondition,
                  fmt::format("{} was lost and there is no checkpoint in {} to restore it from", ps, directory_.string()));
    }
    // Only what the lost ps held, and all of it: a value the checkpoint does not track is lost.
    std::vector<checkpoint_variable> held_variables;
    for (const auto& name : variables) {
      const auto v = std::find_if(self->variables.begin(), self->variables.end(),
                                  [&](const auto& t) { return t.ref.name == name; });
      if (v == self->variables.end()) {
        throw error(errc::failed_precondition,
                    fmt::format("{} was lost holding variable '{}', which the checkpoint does not track: it cannot be "
                                "restored (track every variable to restore a lost ps)",
                                ps, name));
      }
      held_variables.push_back(*v);
    }
    std::vector<checkpoint_table> held_tables;  // copies: a table tracked meanwhile moves the list
    for (const auto& name : tables) {
      const auto t = std::find_if(self->tables.begin(), self->tables.end(),
                                  [&](const auto& table) { return table.ref.name == name; });
      if (t == self->tables.end()) {
        throw error(errc::failed_precondition,
                    fmt::format("{} was lost holding a part of hash table '{}', which the checkpoint does not track: "
                                "it cannot be restored",
                                ps, name));
      }
      held_tables.push_back(*t);
    }
    auto reader = std::make_shared<checkpoint_reader>(*latest);
    const auto& state = checkpoint_reader_access::of(*reader);
    const std::string where = latest->string();
    const auto slots = decode_slots(metadata_json(state.header.metadata, "slots", where), where);
    const auto targets = match_targets(state, held_variables, slots, where);
    std::vector<std::vector<table_link>> chains;
    for (const auto& t : held_tables) chains.push_back(chain_of(reader, t));
    const auto creations = co_await missing_slots(targets, where, ps_task);
    asio::thread_pool io_thread(1);
    co_await verify_checksums(io_thread, state, targets, where);
    for (const auto& chain : chains) co_await verify_chain(io_thread, chain);
    co_await apply_restore(io_thread, state, targets, creations, self->chunk_bytes, ps_task);
    for (std::size_t i = 0; i < chains.size(); ++i) {
      co_await apply_table_restore(io_thread, chains[i], held_tables[i], self->chunk_bytes, ps_task);
    }
    co_return restored{.checkpoint = where, .step = reader->step()};
  }

  void restored_ps(const std::string& task, const restored& what, double seconds) override {
    if (options_.on_restored) {
      options_.on_restored({.ps = task, .checkpoint = what.checkpoint, .step = what.step, .seconds = seconds});
    }
  }

 private:
  std::weak_ptr<checkpoint_state> state_;
  fs::path directory_;
  ps_restore_options options_;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// checkpoint_manager

namespace {

constexpr std::string_view file_prefix = "ckpt-";
constexpr std::string_view file_suffix = ".safetensors";

bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

}  // namespace

checkpoint_manager::checkpoint_manager(checkpoint& ckpt, fs::path directory, std::size_t max_to_keep,
                                       std::size_t full_every)
    : checkpoint_(&ckpt), directory_(std::move(directory)), max_to_keep_(max_to_keep), full_every_(full_every) {
  fs::create_directories(directory_);
  // A save that crashed left "ckpt-<n>.safetensors.tmp-<pid>": remove it once its process is gone.
  static const std::regex temporary(R"(ckpt-\d+\.safetensors\.tmp-(\d+))");
  for (const auto& entry : fs::directory_iterator(directory_)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, temporary) && !process_alive(std::stol(m[1].str()))) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);
    }
  }
}

std::optional<std::int64_t> checkpoint_manager::number_of(const fs::path& path) {
  const std::string name = path.filename().string();
  if (!name.starts_with(file_prefix) || !name.ends_with(file_suffix)) return std::nullopt;
  const std::string_view digits(name.data() + file_prefix.size(), name.size() - file_prefix.size() - file_suffix.size());
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || n < 0) return std::nullopt;
  return n;
}

std::vector<fs::path> checkpoints_in(const fs::path& directory) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code missing;
  for (const auto& entry : fs::directory_iterator(directory, missing)) {
    if (!entry.is_regular_file()) continue;
    if (const auto n = checkpoint_manager::number_of(entry.path())) found.emplace_back(*n, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [n, p] : found) out.push_back(std::move(p));
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& directory) {
  auto all = checkpoints_in(directory);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::vector<fs::path> checkpoint_manager::checkpoints() const { return checkpoints_in(directory_); }

std::optional<fs::path> checkpoint_manager::latest_checkpoint() const { return pscoro::latest_checkpoint(directory_); }

void checkpoint_manager::restore_lost_ps(ps_restore_options options) {
  const auto core = checkpoint_->state_->core.lock();
  if (!core) {
    throw error(errc::failed_precondition,
                "checkpoint_manager::restore_lost_ps: its checkpoint was not made with a strategy (pscoro::checkpoint "
                "ckpt(strategy)), or the strategy is gone: nothing could restore a lost ps");
  }
  recovery_ = std::make_shared<detail::lost_ps_recovery>(checkpoint_->state_, directory_, std::move(options));
  detail::on_chief(core, [weak = std::weak_ptr<chief::lost_ps_restorer>(recovery_)](detail::coordinator_core& c) {
    c.set_ps_restorer(weak);
  }).get();
}

asio::awaitable<fs::path> checkpoint_manager::save() {
  const auto latest = latest_checkpoint();
  co_return co_await save(latest ? *number_of(*latest) + 1 : 1);
}

asio::awaitable<fs::path> checkpoint_manager::save(std::int64_t number) {
  if (number < 0) throw error(errc::invalid_argument, fmt::format("checkpoint number {} is negative", number));
  const fs::path path = directory_ / fmt::format("{}{}{}", file_prefix, number, file_suffix);
  const auto& last = checkpoint_->state_->last_file;
  const bool incremental = full_every_ > 1 && last && last->save_id != 0 && last->depth + 1 < full_every_;
  const auto started = std::chrono::steady_clock::now();
  // A ps lost during the save fails it (a read meets a closed connection, or a ps that holds nothing
  // yet). When a restorer took that loss in hand (restore_lost_ps), the save waits for the restore
  // and is made again, up to 3 times; the file is written only by a save that read everything.
  const auto chief = checkpoint_->state_->core.lock();
  for (int attempt = 1;; ++attempt) {
    const std::uint64_t losses = chief ? chief->ps_losses_in_hand() : 0;
    std::exception_ptr failure;
    try {
      co_await checkpoint_->save(path, {.incremental = incremental});
    } catch (...) {
      failure = std::current_exception();
    }
    if (!failure) break;
    if (!chief || attempt == 3 || chief->ps_losses_in_hand() == losses) std::rethrow_exception(failure);
    log::warning("checkpoint {}: a ps was lost during the save ({}); saving again once it is restored", path.string(),
                 common::what_of(failure));
    co_await checkpoint_->state_->wait_for_ps_restores();
  }
  metrics::process_view().note_checkpoint(
      path.string(), checkpoint_->step_, std::chrono::system_clock::now(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (max_to_keep_ > 0) {
    // The newest max_to_keep, and every file one of them builds on (an unreadable file builds on
    // nothing: a restore of it fails on its own).
    auto all = checkpoints();
    std::set<fs::path> kept;
    for (std::size_t i = all.size() > max_to_keep_ ? all.size() - max_to_keep_ : 0; i < all.size(); ++i) {
      for (std::optional<fs::path> file = all[i].lexically_normal(); file && kept.insert(*file).second;) {
        try {
          const checkpoint_reader reader(*file);
          file = reader.base() ? std::optional(reader.base()->path) : std::nullopt;
        } catch (const std::exception&) {
          file.reset();
        }
      }
    }
    for (const auto& file : all) {
      if (kept.contains(file.lexically_normal())) continue;
      std::error_code ignored;
      fs::remove(file, ignored);
    }
  }
  co_return path;
}

}  // namespace pscoro
