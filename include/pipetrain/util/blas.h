// Which BLAS library LibTorch's GEMMs run on in this process.
//
// Debian's LibTorch calls whatever libblas.so.3 the system provides; the netlib reference
// BLAS is about 19x slower than OpenBLAS on our GEMMs, so the tools report it and warn.
#pragma once

#include <string>

namespace pipetrain::util {

struct BlasInfo {
  std::string name;     // "OpenBLAS", "MKL", "BLIS", "reference", or "unknown"
  std::string library;  // resolved path of the loaded shared object, empty if none found
  std::string config;   // the library's own description where it offers one
  bool is_reference = false;
};

// Inspects the shared objects loaded in this process.
BlasInfo blas_info();

// One line for logs, e.g. "BLAS: OpenBLAS (.../openblas-openmp/libblas.so.3) OpenBLAS 0.3.21 ...".
std::string describe_blas(const BlasInfo& info);

// The warning to print when the reference BLAS is active, or "" when it is not.
std::string blas_warning(const BlasInfo& info);

}  // namespace pipetrain::util
