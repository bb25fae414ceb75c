// Which BLAS library LibTorch's GEMMs run on in this process.
#include "pipetrain/util/blas.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <vector>

namespace pipetrain::util {
namespace {

std::vector<std::string> loaded_libraries() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(out)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  return names;
}

std::string resolve(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf)) return buf;
  return path;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

BlasInfo blas_info() {
  BlasInfo info;
  info.name = "unknown";
  for (const auto& raw : loaded_libraries()) {
    const std::string path = resolve(raw);
    if (contains(path, "mkl_rt") || contains(path, "libmkl")) {
      info = {"MKL", path, "", false};
      break;
    }
    if (contains(path, "openblas")) {
      info = {"OpenBLAS", path, "", false};
      break;
    }
    if (contains(path, "blis")) {
      info = {"BLIS", path, "", false};
      break;
    }
    if (contains(path, "libblas.so")) {
      // Debian's netlib reference BLAS lives in .../blas/libblas.so.3.
      info = {"reference", path, "", true};
    }
  }
  // OpenBLAS can also hide behind the libblas.so.3 name; its own symbol settles it.
  using ConfigFn = char* (*)();
  if (auto fn = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    info.name = "OpenBLAS";
    info.is_reference = false;
    info.config = fn();
  }
  return info;
}

std::string describe_blas(const BlasInfo& info) {
  std::string line = "BLAS: " + info.name;
  if (!info.library.empty()) line += " (" + info.library + ")";
  if (!info.config.empty()) line += " " + info.config;
  return line;
}

std::string blas_warning(const BlasInfo& info) {
  if (!info.is_reference) return "";
  return "warning: LibTorch is running on the netlib reference BLAS (" + info.library +
         "), about 19x slower than OpenBLAS on pipetrain's GEMMs. Install an optimised BLAS: "
         "`sudo apt-get install libopenblas0-openmp` (or run scripts/install-deps.sh).";
}

}  // namespace pipetrain::util
