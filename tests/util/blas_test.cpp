// The BLAS report names the library LibTorch actually calls.
#include "pipetrain/util/blas.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::util {
namespace {

TEST(Blas, ReportsALoadedLibrary) {
  torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));  // makes sure LibTorch is loaded
  const auto info = blas_info();
  EXPECT_NE(info.name, "unknown") << describe_blas(info);
  EXPECT_NE(describe_blas(info).find(info.name), std::string::npos);
  EXPECT_EQ(blas_warning(info).empty(), !info.is_reference);
}

TEST(Blas, WarnsAboutTheReferenceBlas) {
  BlasInfo reference{"reference", "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3", "", true};
  const auto warning = blas_warning(reference);
  EXPECT_NE(warning.find("libopenblas0-openmp"), std::string::npos) << warning;
  EXPECT_NE(warning.find(reference.library), std::string::npos) << warning;
}

}  // namespace
}  // namespace pipetrain::util
