// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of checkpoint tensors
// (train/checkpoint.h) and of TensorBoard's record framing. crc32c("123456789") == 0xE3069283.
// Uses the SSE4.2 crc32 instruction where the build has it (three interleaved streams, ~1 byte
// per cycle per stream), a slicing-by-8 table otherwise; both give the same value.
#pragma once
#include <cstddef>
#include <cstdint>

namespace loom {

// Continues a CRC: crc32c(b, n2, crc32c(a, n1)) == crc32c(a ++ b). Start with 0.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table path alone (what crc32c runs on builds without SSE4.2), for tests.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace loom
