// CRC-32C against its published check values, and TensorFlow's masking.
#include "pipetrain/util/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace pipetrain::util {
namespace {

TEST(Crc32c, MatchesTheCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the catalogue's check value for CRC-32C
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of ones, ascending, descending.
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string s = "pipeline-parallel training";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), crc32c(s)) << cut;
  }
}

TEST(Crc32c, MaskIsTensorFlows) {
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  const uint32_t crc = crc32c("123456789");
  EXPECT_EQ(mask_crc32c(crc), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0x00008000u), 0xa282ead9u);  // bit 15 rotates to bit 0
}

}  // namespace
}  // namespace pipetrain::util
