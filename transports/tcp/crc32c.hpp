// CRC-32C (Castagnoli), the optional checksum of TCP transport frames. Uses the SSE4.2 crc32
// instruction where the CPU has it, a table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus::transport {

/// Continues a CRC-32C over `bytes` bytes (start with crc = 0).
uint32_t crc32c(uint32_t crc, const void* data, size_t bytes);

}  // namespace chorus::transport
