// A file's bytes in order, inflated when it is gzip: one reader for the plain and gzipped inputs of
// IDX and TFRecord, told apart by their content (gzip's first two bytes, 1f 8b), as zlib's gzread
// told them apart before. Gzip is inflated with ISA-L (Debian's libisal, igzip): 2.3x zlib's speed
// on Fashion-MNIST's 26 MB of training images, which every worker inflates during its first epoch
// (docs/design.md, "Datasets").
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct inflate_state;

namespace pscoro::data {

class file_reader {
 public:
  /// Whether a file whose first bytes (up to 256 KiB of them) are these is plain even though it
  /// starts as gzip does: a format whose own header can start with 1f 8b tells which it is.
  using plain_check = bool (*)(std::span<const unsigned char> first);

  /// Opens `path`; errc::not_found (with the system's reason) when it cannot.
  explicit file_reader(std::string path, plain_check is_plain = nullptr);
  ~file_reader();
  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;

  /// Up to `n` bytes into `out`: all `n` unless the data ends first (0 at its end). Gzip members
  /// follow one another as one stream, each one's CRC-32 and length checked; a file that ends
  /// inside a member ends there, as zlib's gzread did (a TFRecord writer's flush makes what it
  /// wrote readable before it closes; the formats' own framing reports a cut record or row).
  /// errc::data_loss, naming the file, the byte of the file where the inflater was and why, for
  /// corrupt deflate data, a wrong checksum or length, and bytes after a member that start no
  /// other member: thrown by the first read that needs bytes from there on (every byte before
  /// the damage is delivered). errc::unavailable for a read of the file that fails.
  std::size_t read(void* out, std::size_t n);
  /// Whether the file is gzip.
  bool compressed() const noexcept { return inflater_ != nullptr; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::size_t read_file(void* out, std::size_t n);  // the file's own bytes
  std::size_t produce(unsigned char* out, std::size_t n);  // its content: read_file, or inflate
  bool fill_input();                                // false at the file's end
  std::size_t inflate(unsigned char* out, std::size_t n);
  void corrupt(const std::string& why);  // what the next read that needs more throws

  std::string path_;
  int fd_ = -1;
  std::uint64_t file_offset_ = 0;  // bytes of the file read so far
  std::unique_ptr<inflate_state> inflater_;
  std::vector<unsigned char> input_;  // compressed bytes read, not inflated yet: from inflater_->next_in
  std::vector<unsigned char> ready_;  // content not returned yet: [ready_begin_, ready_end_)
  std::size_t ready_begin_ = 0, ready_end_ = 0;
  bool member_done_ = false;          // the last member ended; another may follow
  bool at_end_ = false;               // nothing follows
  std::exception_ptr failure_;        // the damage inflating stopped at
};

/// What a dataset of `format` files reads, for its description(): "CSV file 'a.csv'", "TFRecord
/// files 'a', 'b', 'c' and 5 more".
std::string describe_files(std::string_view format, const std::vector<std::string>& paths);

}  // namespace pscoro::data
