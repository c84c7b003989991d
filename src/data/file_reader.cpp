#include "data/file_reader.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>
#include <isa-l/igzip_lib.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace pscoro::data {

namespace {

// Bytes read from the file at a time, and content inflated at a time for small reads.
constexpr std::size_t step = std::size_t{256} << 10;

bool starts_member(const unsigned char* p) noexcept { return p[0] == 0x1f && p[1] == 0x8b; }

const char* reason(int code) noexcept {
  switch (code) {
    case ISAL_INVALID_BLOCK: return "an invalid deflate block";
    case ISAL_INVALID_SYMBOL: return "an invalid deflate symbol";
    case ISAL_INVALID_LOOKBACK: return "a back-reference to before the start of the data";
    case ISAL_INVALID_WRAPPER: return "an invalid gzip header or trailer";
    case ISAL_UNSUPPORTED_METHOD: return "a compression method other than deflate";
    case ISAL_INCORRECT_CHECKSUM: return "the member's CRC-32 or length does not match its data";
    default: return "data the inflater cannot read";
  }
}

}  // namespace

file_reader::file_reader(std::string path, plain_check is_plain) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw error(errc::not_found, fmt::format("{}: cannot open: {}", path_, std::strerror(errno)));
  try {
    ready_.resize(step);
    const std::size_t first = read_file(ready_.data(), ready_.size());
    if (first >= 2 && starts_member(ready_.data()) && !(is_plain && is_plain({ready_.data(), first}))) {
      input_ = std::move(ready_);
      ready_.resize(step);
      inflater_ = std::make_unique<inflate_state>();
      isal_inflate_init(inflater_.get());
      inflater_->crc_flag = ISAL_GZIP;
      inflater_->next_in = input_.data();
      inflater_->avail_in = static_cast<std::uint32_t>(first);
    } else {
      ready_end_ = first;  // a plain file's first bytes, read already
    }
  } catch (...) {
    ::close(fd_);  // a throwing constructor runs no destructor
    throw;
  }
}

file_reader::~file_reader() { ::close(fd_); }

std::size_t file_reader::read_file(void* out, std::size_t n) {
  auto* to = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, to + got, std::min<std::size_t>(n - got, std::size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      throw error(errc::unavailable,
                  fmt::format("{}: read failed at byte {}: {}", path_, file_offset_ + got, std::strerror(errno)));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  file_offset_ += got;
  return got;
}

// Small reads (an IDX row, a TFRecord header) are served from ready_, filled a step at a time: an
// inflate call per 784-byte row, with other work between calls, was twice as slow per byte as
// inflating 256 KiB at once (the inflater's tables go cold). Large ones go straight to the caller.
std::size_t file_reader::read(void* out, std::size_t n) {
  auto* to = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < n) {
    if (ready_begin_ == ready_end_) {
      if (failure_) std::rethrow_exception(failure_);  // every byte before the damage was delivered
      if (n - got >= ready_.size()) {
        got += produce(to + got, n - got);
        if (got < n && failure_) std::rethrow_exception(failure_);
        break;
      }
      ready_begin_ = 0;
      ready_end_ = produce(ready_.data(), ready_.size());
      if (ready_end_ == 0 && failure_) std::rethrow_exception(failure_);
      if (ready_end_ == 0) break;
    }
    const std::size_t k = std::min(n - got, ready_end_ - ready_begin_);
    std::memcpy(to + got, ready_.data() + ready_begin_, k);
    ready_begin_ += k;
    got += k;
  }
  return got;
}

std::size_t file_reader::produce(unsigned char* out, std::size_t n) {
  return inflater_ ? inflate(out, n) : read_file(out, n);
}

// The compressed bytes not inflated yet move to the front of input_, and more are read behind them.
bool file_reader::fill_input() {
  const std::size_t left = inflater_->avail_in;
  if (left) std::memmove(input_.data(), inflater_->next_in, left);
  const std::size_t more = read_file(input_.data() + left, input_.size() - left);
  inflater_->next_in = input_.data();
  inflater_->avail_in = static_cast<std::uint32_t>(left + more);
  return more > 0;
}

// Stops at the end of the data, or at damage (failure_), with what was inflated before it.
std::size_t file_reader::inflate(unsigned char* out, std::size_t n) {
  std::size_t got = 0;
  while (got < n && !at_end_ && !failure_) {
    if (member_done_) {
      // Another member, or the end: whatever follows a member must start one.
      if (inflater_->avail_in < 2) fill_input();
      if (inflater_->avail_in == 0) {
        at_end_ = true;
        break;
      }
      if (inflater_->avail_in < 2 || !starts_member(inflater_->next_in)) {
        corrupt("the bytes after the end of a gzip member start no other member");
        break;
      }
      isal_inflate_reset(inflater_.get());
      inflater_->crc_flag = ISAL_GZIP;
      member_done_ = false;
    }
    if (inflater_->avail_in == 0 && !fill_input()) {
      at_end_ = true;  // cut inside a member: its data ends here (see read)
      break;
    }
    inflater_->next_out = out + got;
    inflater_->avail_out = static_cast<std::uint32_t>(std::min<std::size_t>(n - got, std::numeric_limits<std::uint32_t>::max()));
    const std::uint32_t room = inflater_->avail_out, unread = inflater_->avail_in;
    const int code = isal_inflate(inflater_.get());
    const std::uint32_t produced = room - inflater_->avail_out;
    got += produced;
    if (code < 0 || code > ISAL_OUT_OVERFLOW) {
      corrupt(reason(code));  // above ISAL_OUT_OVERFLOW: a header asking for a dictionary, say
    } else if (inflater_->block_state == ISAL_BLOCK_FINISH) {
      member_done_ = true;
    } else if (produced == 0 && inflater_->avail_in == unread) {
      corrupt("the inflater made no progress");  // never seen; a loop that cannot end otherwise
    }
  }
  return got;
}

void file_reader::corrupt(const std::string& why) {
  // The byte of the file the inflater had reached: what was read minus what it has not taken.
  const std::uint64_t at = file_offset_ - inflater_->avail_in;
  failure_ = std::make_exception_ptr(
      error(errc::data_loss, fmt::format("{}: corrupt gzip data at byte {}: {}", path_, at, why)));
}

std::string describe_files(std::string_view format, const std::vector<std::string>& paths) {
  constexpr std::size_t named = 3;  // a long list of shards is named by its first few
  std::string out = fmt::format("{} file{}", format, paths.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < paths.size() && i < named; ++i) out += fmt::format("{} '{}'", i ? "," : "", paths[i]);
  if (paths.size() > named) out += fmt::format(" and {} more", paths.size() - named);
  return out;
}

}  // namespace pscoro::data
