#include "common/regular_file.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace pscoro::common {

std::string_view file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

void refuse_non_regular_file(std::string_view what, const std::string& path, std::string_view kind,
                             std::string_view setting) {
  throw error(errc::invalid_argument,
              fmt::format("{}: {} is {}, not a regular file ({} must name a regular file)", what, path, kind, setting));
}

bool regular_file_exists(std::string_view what, const std::string& path, std::string_view setting) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) refuse_non_regular_file(what, path, file_kind(st.st_mode), setting);
  return true;
}

int open_regular_file(std::string_view what, const std::string& path, int flags, mode_t mode,
                      std::string_view setting) {
  // O_NONBLOCK: a FIFO opens at once (for reading) or fails with ENXIO (for writing, no reader)
  // instead of waiting; fstat then tells what was opened, with no window for a swap after a stat.
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NONBLOCK, mode);
  if (fd < 0) {
    const int why = errno;
    struct stat st {};
    if (why == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      refuse_non_regular_file(what, path, file_kind(st.st_mode), setting);
    }
    errno = why;
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const auto kind = file_kind(st.st_mode);
    ::close(fd);
    refuse_non_regular_file(what, path, kind, setting);
  }
  // A regular file ignores O_NONBLOCK on Linux; cleared all the same, so nothing depends on that.
  const int status = ::fcntl(fd, F_GETFL);
  if (status >= 0) ::fcntl(fd, F_SETFL, status & ~O_NONBLOCK);
  return fd;
}

}  // namespace pscoro::common
