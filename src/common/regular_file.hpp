// Opening a file a setting names (a checkpoint path, a cache file) without blocking: open(2) of a
// FIFO waits for a process at its other end, forever if none comes, and a device or a directory
// reads as something that is not the file the setting meant. Such a path is refused, naming it,
// what it is and the setting, before anything is read or written.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace pscoro::common {

/// What a file of mode `mode` (stat's st_mode) is, for a message: "a FIFO", "a directory", ...
std::string_view file_kind(mode_t mode) noexcept;

/// The error for `path`, a `kind` (file_kind) given as `setting`: errc::invalid_argument,
/// "<what>: <path> is a FIFO, not a regular file (<setting> must name a regular file)".
[[noreturn]] void refuse_non_regular_file(std::string_view what, const std::string& path, std::string_view kind,
                                          std::string_view setting);

/// Whether `path` exists (following symbolic links), throwing refuse_non_regular_file's error when
/// it is something other than a regular file. False too when it cannot be examined: the open that
/// follows reports why.
bool regular_file_exists(std::string_view what, const std::string& path, std::string_view setting);

/// open(2) of `path` with `flags` | O_CLOEXEC that never blocks (O_NONBLOCK, cleared once the file
/// is known to be regular): the descriptor, or -1 with errno set as open() left it. A path that is
/// not a regular file is closed again and refused (refuse_non_regular_file).
int open_regular_file(std::string_view what, const std::string& path, int flags, mode_t mode,
                      std::string_view setting);

}  // namespace pscoro::common
