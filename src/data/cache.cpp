// The file behind dataset::cache(filename). A 16-byte header: the magic "PSCACHE2", the block
// size B (u32) and the CRC-32C of those 12 bytes (u32). Then the data in blocks: B bytes each
// (the last one 1 to B), every block followed by the CRC-32C of its index (u64) and its bytes
// (u32), so a reader checks each block before it uses any of it, and a block read in the wrong
// place fails too. The data: the signature of the element type (u64 length, bytes), each element
// behind a 1 byte and, after the last, a 0 byte and the number of elements (u64). All in host
// byte order. Written under a temporary name and renamed into place at the end of a pass, so a
// file with the cache's name is always a finished one (TF deletes a partial cache on the same
// grounds). "PSCACHE1" files (the same data, no blocks, no checksums) are rebuilt, never read.
#include <pscoro/dataset.hpp>

#include "common/crc32c.hpp"
#include "common/log.hpp"
#include "common/regular_file.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

namespace pscoro::detail {

namespace {

constexpr char cache_magic[8] = {'P', 'S', 'C', 'A', 'C', 'H', 'E', '2'};
// The format before blocks and checksums: the same data, unchecked.
constexpr char unchecked_cache_magic[8] = {'P', 'S', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr std::size_t cache_header_size = 16;  // magic, block size, CRC-32C
constexpr std::size_t block_crc_size = 4;
// A reader allocates one block: a corrupt header may not make that large.
constexpr std::uint64_t max_block_size = std::uint64_t{64} << 20;
// Far more than any element type has; keeps a corrupt count from reading on for long.
constexpr std::uint64_t max_signature = 4096;
constexpr std::uint64_t max_dimensions = 64;

constexpr std::string_view cache_setting = "the file of dataset::cache(filename)";

// The checksum of block `index` holding `size` bytes at `payload`: the index goes first, so a block
// read in another block's place fails its check.
std::uint32_t block_crc(std::uint64_t index, const void* payload, std::size_t size) {
  return common::crc32c_extend(common::crc32c(&index, sizeof index), payload, size);
}

// The 16-byte header for blocks of `block_size` bytes.
std::string encode_cache_header(std::uint32_t block_size) {
  std::string out(cache_magic, sizeof cache_magic);
  out.append(reinterpret_cast<const char*>(&block_size), sizeof block_size);
  const std::uint32_t crc = common::crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return out;
}

}  // namespace

bool cache_file_ready(const std::string& path) {
  if (!common::regular_file_exists("cache", path, cache_setting)) return false;
  const int fd = common::open_regular_file("cache", path, O_RDONLY, 0, cache_setting);
  if (fd < 0) return true;  // the reader says why it cannot open it
  char head[sizeof cache_magic] = {};
  const ssize_t n = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  if (n == static_cast<ssize_t>(sizeof head) && std::memcmp(head, unchecked_cache_magic, sizeof head) == 0) {
    log::warning("cache: {} was written by an older pscoro, without checksums: it is not read, this pass "
                 "reads upstream and writes it again",
                 path);
    return false;
  }
  return true;  // the reader checks the rest
}

// ---------------------------------------------------------------------------------------------
// Writing

cache_file_writer::cache_file_writer(std::string path, const std::string& signature, std::size_t block_size)
    : path_(std::move(path)) {
  if (block_size == 0 || block_size > max_block_size) {
    throw error(errc::invalid_argument,
                fmt::format("cache: a block of {} bytes for {} (1 to {})", block_size, path_, max_block_size));
  }
  static std::atomic<std::uint64_t> files{0};
  temporary_ = fmt::format("{}.tmp-{}-{}", path_, ::getpid(), files.fetch_add(1));
  fd_ = common::open_regular_file("cache", temporary_, O_WRONLY | O_CREAT | O_TRUNC, 0644, cache_setting);
  if (fd_ < 0) {
    throw error(errc::unavailable, fmt::format("cache: cannot write {}: {}", temporary_, std::strerror(errno)));
  }
  try {
    block_.resize(block_size);
    const std::string header = encode_cache_header(static_cast<std::uint32_t>(block_size));
    write_fully(header.data(), header.size());
    write_u64(signature.size());
    write(signature.data(), signature.size());
  } catch (...) {
    ::close(fd_);  // a throwing constructor runs no destructor
    ::unlink(temporary_.c_str());
    throw;
  }
}

cache_file_writer::~cache_file_writer() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());  // an unfinished pass leaves nothing behind
  }
}

void cache_file_writer::fail(const char* doing) {
  // After a failed write the file has half a block: nothing more goes in, and it is never
  // committed.
  broken_ = true;
  throw error(errc::unavailable, fmt::format("cache: {} {} failed: {}", doing, temporary_, std::strerror(errno)));
}

void cache_file_writer::write_fully(const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void cache_file_writer::write_block(const char* payload, std::size_t size) {
  const std::uint32_t crc = block_crc(blocks_, payload, size);
  // One call for the block and its checksum; a short write goes on from where it stopped.
  iovec parts[2] = {{const_cast<char*>(payload), size}, {const_cast<std::uint32_t*>(&crc), sizeof crc}};
  std::size_t done = 0;
  const std::size_t total = size + sizeof crc;
  while (done < total) {
    const ssize_t n = done < size ? ::writev(fd_, parts, 2) : ::write(fd_, reinterpret_cast<const char*>(&crc) +
                                                                               (done - size), total - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    done += static_cast<std::size_t>(n);
    if (done < size) {
      parts[0].iov_base = const_cast<char*>(payload) + done;
      parts[0].iov_len = size - done;
    }
  }
  ++blocks_;
}

void cache_file_writer::write(const void* data, std::size_t size) {
  if (broken_) throw error(errc::unavailable, fmt::format("cache: an earlier write to {} failed", temporary_));
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    if (filled_ == 0 && size >= block_.size()) {  // a whole block straight from the caller's bytes
      write_block(p, block_.size());
      p += block_.size();
      size -= block_.size();
      continue;
    }
    const std::size_t n = std::min(size, block_.size() - filled_);
    std::memcpy(block_.data() + filled_, p, n);
    filled_ += n;
    p += n;
    size -= n;
    if (filled_ == block_.size()) {
      write_block(block_.data(), filled_);
      filled_ = 0;
    }
  }
}

void cache_file_writer::begin_element() {
  const unsigned char more = 1;
  write(&more, 1);
  ++elements_;
}

void cache_file_writer::commit() {
  const unsigned char end = 0;
  write(&end, 1);
  write_u64(elements_);
  if (filled_ > 0) write_block(block_.data(), filled_);  // never empty: the end mark is in it or before
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int why = errno;
    ::unlink(temporary_.c_str());
    throw error(errc::unavailable, fmt::format("cache: writing {} failed: {}", temporary_, std::strerror(why)));
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int why = errno;
    ::unlink(temporary_.c_str());
    throw error(errc::unavailable,
                fmt::format("cache: cannot rename {} to {}: {}", temporary_, path_, std::strerror(why)));
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

cache_file_reader::cache_file_reader(std::string path, const std::string& signature) : path_(std::move(path)) {
  fd_ = common::open_regular_file("cache", path_, O_RDONLY, 0, cache_setting);
  if (fd_ < 0) throw error(errc::not_found, fmt::format("cache: cannot open {}: {}", path_, std::strerror(errno)));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) corrupt(fmt::format("cannot tell its size: {}", std::strerror(errno)));
    size_ = static_cast<std::uint64_t>(st.st_size);
    char header[cache_header_size] = {};
    if (size_ < sizeof cache_magic) corrupt(fmt::format("not a pscoro dataset cache ({} bytes)", size_));
    read_at(header, sizeof cache_magic, 0);
    if (std::memcmp(header, unchecked_cache_magic, sizeof cache_magic) == 0) {
      corrupt("written by an older pscoro, without checksums (a new pass writes it again)");
    }
    if (std::memcmp(header, cache_magic, sizeof cache_magic) != 0) {
      corrupt("not a pscoro dataset cache (bad magic at byte 0)");
    }
    if (size_ < cache_header_size) {
      corrupt(fmt::format("truncated in its header ({} bytes of {})", size_, cache_header_size));
    }
    read_at(header, cache_header_size, 0);
    std::uint32_t block_size = 0, crc = 0;
    std::memcpy(&block_size, header + 8, sizeof block_size);
    std::memcpy(&crc, header + 12, sizeof crc);
    const std::uint32_t actual = common::crc32c(header, 12);
    if (crc != actual) corrupt(fmt::format("its header is corrupt (CRC-32C {:08x} where it says {:08x})", actual, crc));
    if (block_size == 0 || block_size > max_block_size) corrupt(fmt::format("a block size of {} bytes", block_size));
    block_size_ = block_size;
    // Full blocks, then a last one of 1 to B bytes: its size is what is left.
    const std::uint64_t stored = size_ - cache_header_size;
    const std::uint64_t full = stored / (block_size_ + block_crc_size), rest = stored % (block_size_ + block_crc_size);
    if (stored == 0) corrupt(fmt::format("truncated: no data after the header at byte {}", cache_header_size));
    if (rest != 0 && rest <= block_crc_size) {
      corrupt(fmt::format("truncated: its last block, at byte {}, has {} bytes, too few for its checksum",
                          size_ - rest, rest));
    }
    data_size_ = full * block_size_ + (rest == 0 ? 0 : rest - block_crc_size);
    block_.resize(static_cast<std::size_t>(std::min(block_size_, data_size_)));

    const auto length = read_u64("the element type's length");
    if (length > max_signature || length > left()) {
      corrupt(fmt::format("an element type {} bytes long at byte {}", length, file_offset(offset_ - 8)));
    }
    std::string written(length, '\0');
    read(written.data(), written.size(), "the element type");
    if (written != signature) {
      throw error(errc::invalid_argument,
                  fmt::format("cache: {} holds elements of type {}, this dataset's are {} (use another file name)",
                              path_, written, signature));
    }
  } catch (...) {
    ::close(fd_);  // a throwing constructor runs no destructor
    throw;
  }
}

cache_file_reader::~cache_file_reader() {
  if (fd_ >= 0) ::close(fd_);
}

void cache_file_reader::corrupt(const std::string& what) const {
  throw error(errc::data_loss, fmt::format("cache: {}: {}", path_, what));
}

std::uint64_t cache_file_reader::file_offset(std::uint64_t data_offset) const noexcept {
  const std::uint64_t block = data_offset / block_size_;
  return cache_header_size + block * (block_size_ + block_crc_size) + data_offset % block_size_;
}

void cache_file_reader::read_at(void* into, std::size_t size, std::uint64_t offset) const {
  auto* p = static_cast<char*>(into);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw error(errc::unavailable, fmt::format("cache: reading {} failed: {}", path_, std::strerror(errno)));
    if (n == 0) corrupt(fmt::format("ends at byte {}, before its size said (changed while read?)", offset));
    p += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void cache_file_reader::load_block(char* into, std::size_t payload) {
  const std::uint64_t at = cache_header_size + next_block_ * (block_size_ + block_crc_size);
  read_at(into, payload, at);
  std::uint32_t written = 0;
  read_at(&written, sizeof written, at + payload);
  const std::uint32_t actual = block_crc(next_block_, into, payload);
  if (actual != written) {
    corrupt(fmt::format("block {} (bytes {} to {}) is corrupt: CRC-32C {:08x} where the file says {:08x}",
                        next_block_, at, at + payload + block_crc_size, actual, written));
  }
  ++next_block_;
}

void cache_file_reader::read(void* data, std::size_t size, const char* what) {
  if (size > left()) {
    corrupt(fmt::format("truncated at byte {}: {} ({} bytes) is incomplete", file_offset(offset_), what, size));
  }
  auto* out = static_cast<char*>(data);
  while (size > 0) {
    if (position_ == end_) {
      // The next block's payload: B bytes, or what is left in the last one.
      const auto payload = static_cast<std::size_t>(std::min(block_size_, data_size_ - next_block_ * block_size_));
      if (size >= payload) {  // wholly wanted: straight into the caller's memory, no copy
        load_block(out, payload);
        out += payload;
        size -= payload;
        offset_ += payload;
        continue;
      }
      load_block(block_.data(), payload);
      position_ = 0;
      end_ = payload;
    }
    const std::size_t n = std::min(size, end_ - position_);
    std::memcpy(out, block_.data() + position_, n);
    position_ += n;
    out += n;
    size -= n;
    offset_ += n;
  }
}

std::uint64_t cache_file_reader::read_u64(const char* what) {
  std::uint64_t v = 0;
  read(&v, sizeof v, what);
  return v;
}

bool cache_file_reader::next_element() {
  unsigned char mark = 0;
  read(&mark, 1, "an element mark");
  if (mark == 1) {
    ++elements_;
    return true;
  }
  if (mark != 0) corrupt(fmt::format("bad element mark {} at byte {}", mark, file_offset(offset_ - 1)));
  const auto count = read_u64("the element count");
  if (count != elements_) {
    corrupt(fmt::format("its end says {} elements, {} were read", count, elements_));
  }
  if (left() != 0) corrupt(fmt::format("{} bytes of data after the end, at byte {}", left(), file_offset(offset_)));
  return false;
}

std::uint64_t cache_file_reader::read_length(std::uint64_t unit, const char* what) {
  const auto at = file_offset(offset_);
  const auto length = read_u64(what);
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(length, unit, &bytes) || bytes > left()) {
    corrupt(fmt::format("{} {} at byte {} runs past the end of the data ({} bytes left)", what, length, at, left()));
  }
  return length;
}

std::vector<std::size_t> cache_file_reader::read_shape(std::size_t element_size) {
  const auto at = file_offset(offset_);
  const auto dimensions = read_u64("an array's rank");
  if (dimensions > max_dimensions) corrupt(fmt::format("an array of {} dimensions at byte {}", dimensions, at));
  std::vector<std::size_t> shape;
  std::uint64_t bytes = element_size;
  std::uint64_t nonzero_bytes = element_size;  // xtensor's strides are signed: they must fit too
  for (std::uint64_t i = 0; i < dimensions; ++i) {
    const auto d = read_u64("an array's dimensions");
    if (__builtin_mul_overflow(bytes, d, &bytes) ||
        __builtin_mul_overflow(nonzero_bytes, std::max<std::uint64_t>(d, 1), &nonzero_bytes) ||
        nonzero_bytes > std::uint64_t{INT64_MAX}) {
      corrupt(fmt::format("the dimensions of the array at byte {} overflow a 64-bit byte count", at));
    }
    shape.push_back(static_cast<std::size_t>(d));
  }
  if (bytes > left()) {
    corrupt(fmt::format("the array at byte {} needs {} bytes, {} are left", at, bytes, left()));
  }
  return shape;
}

}  // namespace pscoro::detail
