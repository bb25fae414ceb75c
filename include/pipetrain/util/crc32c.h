// CRC-32C (Castagnoli), the checksum of TFRecord files, and TensorFlow's masked form of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pipetrain::util {

// Reflected, polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF:
// crc32c("123456789") = 0xE3069283. `crc` continues an earlier checksum of the preceding bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

// TFRecord stores checksums masked, because a CRC of data that holds CRCs is weak:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);

}  // namespace pipetrain::util
