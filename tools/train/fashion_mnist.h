// Fashion-MNIST for the example training model: a loader for the gzipped IDX
// files and the deterministic per-rank sample order every worker follows.
//
// Files: Debian's dataset-fashion-mnist installs them under kFashionMnistDir
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz and the t10k-*
// pair). Pixels are scaled to [0, 1] as p / 255 and NOT standardised: inputs
// stay non-negative (so the MLP can skip zero pixels) and the result does not
// depend on a mean/std convention (0.2860/0.3530 for the training split)
// that every reader would otherwise have to agree on.
//
// Thread safety: the functions share no state and may be called concurrently.
// A Dataset is a plain value: concurrent reads are safe, writes are not.
#ifndef SHARDPS_TOOLS_TRAIN_FASHION_MNIST_H_
#define SHARDPS_TOOLS_TRAIN_FASHION_MNIST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardps::train {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr int kImageRows = 28;
inline constexpr int kImageCols = 28;
inline constexpr int kImagePixels = kImageRows * kImageCols;
inline constexpr int kNumClasses = 10;

enum class Split { kTrain, kTest };

// Labelled images held in memory; owns its buffers.
struct Dataset {
  std::vector<float> images;    // size() x kImagePixels, row-major, each in [0, 1].
  std::vector<uint8_t> labels;  // size() entries, each < kNumClasses.

  size_t size() const { return labels.size(); }
  // REQUIRES: i < size().
  const float* image(size_t i) const { return images.data() + i * kImagePixels; }
};

// Reads the `split` files of Fashion-MNIST from `dir`. With limit > 0 only the
// first `limit` samples are read (and checked); 0 reads them all and also
// checks that each file ends after its records with a valid gzip trailer.
// Returns NotFound when a file cannot be opened and DataLoss when a file is
// not a valid IDX file of 28x28 images / labels < 10, is truncated, or the
// image and label files disagree on the sample count; the message names the
// file and what is wrong.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split, size_t limit = 0);

// Returns the sample indices rank `rank` of `world` visits in `epoch`: its
// contiguous shard [rank*n/world, (rank+1)*n/world) of [0, n), shuffled with a
// Fisher-Yates pass driven by std::mt19937_64 seeded from (seed, epoch, rank).
// The draw is done here (not std::shuffle / uniform_int_distribution, whose
// output is implementation-defined), so the order is identical on every
// platform and standard library.
// REQUIRES: 0 <= rank < world, n <= 2^32 - 1.
std::vector<uint32_t> ShardIndices(size_t n, int rank, int world, uint64_t seed, int epoch);

// Copies the samples `indices` of `data` into contiguous batch buffers
// (resized to indices.size() samples; no reallocation once large enough).
// REQUIRES: every index < data.size().
void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices,
                 std::vector<float>* images, std::vector<uint8_t>* labels);

}  // namespace shardps::train

#endif  // SHARDPS_TOOLS_TRAIN_FASHION_MNIST_H_
