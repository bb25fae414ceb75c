// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017) from the Debian package dataset-fashion-mnist.
#pragma once

#include <torch/torch.h>

#include <array>
#include <string>

namespace pipetrain::data {

// Where the Debian package puts the gzipped IDX files; PIPETRAIN_FASHION_MNIST_DIR overrides.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The training set's pixel mean and standard deviation (of x / 255), for normalisation.
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr int64_t kFashionMnistClasses = 10;

enum class Split { kTrain, kTest };

// A labelled image set held in memory.
struct ImageSet {
  torch::Tensor images;  // [N, 1, 28, 28] float32, (x / 255 - mean) / std
  torch::Tensor labels;  // [N] int64 in [0, 10)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// `dir`, or PIPETRAIN_FASHION_MNIST_DIR, or kFashionMnistDir.
std::string fashion_mnist_dir(const std::string& dir = "");
// The two files of a split: {images, labels}, e.g. train-images-idx3-ubyte.gz.
std::array<std::string, 2> fashion_mnist_files(Split split, const std::string& dir = "");
// Throws DataError naming the first missing file and the fix (install the package).
void check_fashion_mnist(const std::string& dir = "");
// Reads and checks one split: magic numbers, 28 x 28 images, as many labels as images,
// labels below 10. DataError naming the file and the fix otherwise.
ImageSet load_fashion_mnist(Split split, const std::string& dir = "");

// "T-shirt/top", "Trouser", ... indexed by label.
const std::array<const char*, 10>& fashion_mnist_classes();

}  // namespace pipetrain::data
