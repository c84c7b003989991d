// How pscoro allocates large buffers: aligned to a cache line, and under transparent huge pages
// when large (docs/design.md, "Large buffers: cache-line aligned, huge pages").
#pragma once

#include <cstddef>

namespace pscoro::common {

/// The alignment of every byte_buffer pscoro allocates: a cache line, so that a row of 64 bytes (16
/// floats) is one line, not two, when rows are gathered or scattered at random.
inline constexpr std::size_t buffer_alignment = 64;

/// A buffer of at least this many bytes is advised huge pages before anything is written to it.
inline constexpr std::size_t huge_page_threshold = std::size_t{4} << 20;

/// The size of a transparent huge page, if the system has them (0: none, or unknown).
std::size_t huge_page_bytes() noexcept;

/// Asks for transparent huge pages under `bytes` bytes at `data`, about to be written for the first
/// time, when they are at least huge_page_threshold: the kernel then maps them in a few faults, not
/// one per 4 KiB page, unmaps them as cheaply, and random accesses to them (a ps's rows) miss the
/// TLB far less. Only the whole huge pages inside are advised; a system whose THP setting is
/// "never" ignores it, and nothing depends on it but speed.
void advise_huge_pages(void* data, std::size_t bytes) noexcept;

}  // namespace pscoro::common
