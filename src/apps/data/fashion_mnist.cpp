// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017) from the Debian package dataset-fashion-mnist.
#include "apps/data/fashion_mnist.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <cstdlib>

#include "apps/data/idx.h"
#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

constexpr const char* kInstallFashionMnist =
    "install the data set with `bash scripts/install-deps.sh` (Debian package "
    "dataset-fashion-mnist) or point --data-dir / PIPETRAIN_FASHION_MNIST_DIR at a directory "
    "holding the four *-idx?-ubyte.gz files";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(fmt::format("IDX file {}: {}; {}", path, what, kInstallFashionMnist));
}

}  // namespace

std::string fashion_mnist_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  if (const char* env = std::getenv("PIPETRAIN_FASHION_MNIST_DIR"); env && *env) return env;
  return kFashionMnistDir;
}

std::array<std::string, 2> fashion_mnist_files(Split split, const std::string& dir) {
  const std::string root = fashion_mnist_dir(dir);
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  return {fmt::format("{}/{}-images-idx3-ubyte.gz", root, prefix),
          fmt::format("{}/{}-labels-idx1-ubyte.gz", root, prefix)};
}

void check_fashion_mnist(const std::string& dir) {
  for (const Split split : {Split::kTrain, Split::kTest}) {
    for (const auto& path : fashion_mnist_files(split, dir)) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw DataError(fmt::format("Fashion-MNIST file {} is missing; {}", path, kInstallFashionMnist));
    }
  }
}

ImageSet load_fashion_mnist(Split split, const std::string& dir) {
  const auto [image_path, label_path] = fashion_mnist_files(split, dir);
  const IdxArray images = read_idx(image_path, kInstallFashionMnist);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28)
    fail(image_path,
         fmt::format("expected images of shape [N, 28, 28] (magic 0x00000803), got [{}]",
                     fmt::join(images.dims, ", ")));
  const IdxArray labels = read_idx(label_path, kInstallFashionMnist);
  if (labels.dims.size() != 1)
    fail(label_path, fmt::format("expected labels of shape [N] (magic 0x00000801), got [{}]",
                                 fmt::join(labels.dims, ", ")));
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n)
    fail(label_path,
         fmt::format("{} labels for the {} images of {}", labels.dims[0], n, image_path));
  for (int64_t i = 0; i < n; ++i) {
    if (labels.data[i] >= kFashionMnistClasses)
      fail(label_path,
           fmt::format("label {} of sample {} is not a class (0 to 9)", int{labels.data[i]}, i));
  }

  ImageSet set;
  auto bytes =
      torch::from_blob(const_cast<uint8_t*>(images.data.data()), {n, 1, 28, 28}, torch::kUInt8);
  set.images = bytes.to(torch::kFloat32)
                   .div_(255.0)
                   .sub_(kFashionMnistMean)
                   .div_(kFashionMnistStd)
                   .contiguous();
  set.labels = torch::from_blob(const_cast<uint8_t*>(labels.data.data()), {n}, torch::kUInt8)
                   .to(torch::kInt64);
  return set;
}

const std::array<const char*, 10>& fashion_mnist_classes() {
  static const std::array<const char*, 10> names{"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                 "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};
  return names;
}

}  // namespace pipetrain::data
