#include "common/memory.hpp"

#include <pscoro/tensor.hpp>

#include <sys/mman.h>

#include <cstdint>
#include <fstream>
#include <new>

namespace pscoro {

namespace common {

std::size_t huge_page_bytes() noexcept {
  static const std::size_t bytes = []() noexcept {
    try {
      std::ifstream in("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
      std::size_t size = 0;
      return in >> size && size > 0 && (size & (size - 1)) == 0 ? size : std::size_t{0};
    } catch (...) {
      return std::size_t{0};
    }
  }();
  return bytes;
}

void advise_huge_pages(void* data, std::size_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
  const std::size_t huge = huge_page_bytes();
  if (huge == 0 || bytes < huge_page_threshold) return;
  const auto first = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = (first + huge - 1) & ~(std::uintptr_t{huge} - 1);
  const std::uintptr_t end = (first + bytes) & ~(std::uintptr_t{huge} - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace common

byte_buffer::byte_buffer(std::size_t size) : size_(size) {
  if (size == 0) return;
  constexpr std::align_val_t alignment{common::buffer_alignment};
  data_ = std::shared_ptr<std::byte[]>(new (alignment) std::byte[size],
                                       [](std::byte* p) { ::operator delete[](p, alignment); });
  common::advise_huge_pages(data_.get(), size);
}

}  // namespace pscoro
