#include "tools/train/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace shardps::train {
namespace {

// IDX magic: two zero bytes, the element type (0x08 = unsigned byte), the rank.
constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// An open IDX file positioned after its header.
struct IdxFile {
  std::string path;
  GzFile file;
  uint32_t count = 0;  // First dimension: number of samples.
};

// zlib's last error on the file, without the path gzerror() prefixes; empty if none.
std::string ZlibError(const IdxFile& idx) {
  int errnum = Z_OK;
  const std::string msg = gzerror(idx.file.get(), &errnum);
  if (errnum == Z_OK) return "";
  const std::string prefix = idx.path + ": ";
  return msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
}

absl::Status Truncated(const IdxFile& idx, const char* what, size_t got, size_t want) {
  const std::string error = ZlibError(idx);
  const std::string detail = error.empty() ? "" : absl::StrCat(" (zlib: ", error, ")");
  return absl::DataLossError(absl::StrCat(idx.path, ": truncated or corrupt while reading ", what,
                                          ": got ", got, " of ", want, " bytes", detail));
}

// Reads exactly `size` bytes, or says why not.
absl::Status ReadExactly(const IdxFile& idx, const char* what, void* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
    const int n = gzread(idx.file.get(), static_cast<char*>(out) + done, chunk);
    if (n <= 0) return Truncated(idx, what, done, size);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ReadBigEndian32(const IdxFile& idx, const char* what) {
  unsigned char b[4];
  if (absl::Status s = ReadExactly(idx, what, b, sizeof(b)); !s.ok()) return s;
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

// Opens `path` and checks its magic; `dims` receives the dimensions after the
// first (the sample count, which goes to IdxFile::count).
absl::StatusOr<IdxFile> OpenIdx(const std::string& path, uint32_t magic,
                                std::vector<uint32_t>* dims) {
  IdxFile idx{path, GzFile(gzopen(path.c_str(), "rb")), 0};
  if (idx.file == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  absl::StatusOr<uint32_t> got = ReadBigEndian32(idx, "magic number");
  if (!got.ok()) return got.status();
  if (*got != magic) {
    return absl::DataLossError(
        absl::StrFormat("%s: bad magic number 0x%08x, expected 0x%08x", path, *got, magic));
  }
  const int rank = static_cast<int>(magic & 0xff);
  for (int d = 0; d < rank; ++d) {
    absl::StatusOr<uint32_t> dim = ReadBigEndian32(idx, "dimensions");
    if (!dim.ok()) return dim.status();
    if (d == 0) {
      idx.count = *dim;
    } else {
      dims->push_back(*dim);
    }
  }
  return idx;
}

// After the last record: the stream must end there, cleanly. Reading to the
// end also makes zlib verify the gzip trailer (CRC-32 and length).
absl::Status ExpectEnd(const IdxFile& idx) {
  char extra;
  const int n = gzread(idx.file.get(), &extra, 1);
  const std::string error = ZlibError(idx);
  if (n < 0 || !error.empty()) {
    return absl::DataLossError(absl::StrCat(idx.path, ": corrupt or truncated gzip stream after ",
                                            idx.count, " records (zlib: ", error, ")"));
  }
  if (n > 0) {
    return absl::DataLossError(
        absl::StrCat(idx.path, ": unexpected bytes after the ", idx.count, " records declared"));
  }
  return absl::OkStatus();
}

// Reads `size` bytes of records, then checks the end of the file when they
// were all of them.
absl::Status ReadRecords(const IdxFile& idx, const char* what, void* out, size_t size,
                         bool all_records) {
  if (absl::Status s = ReadExactly(idx, what, out, size); !s.ok()) return s;
  return all_records ? ExpectEnd(idx) : absl::OkStatus();
}

size_t Limited(uint32_t count, size_t limit) {
  return limit == 0 ? count : std::min<size_t>(count, limit);
}

// Reads images as floats in [0, 1]; returns the count declared in the file.
absl::StatusOr<uint32_t> ReadImages(const std::string& path, size_t limit,
                                    std::vector<float>* images) {
  std::vector<uint32_t> dims;
  absl::StatusOr<IdxFile> idx = OpenIdx(path, kImagesMagic, &dims);
  if (!idx.ok()) return idx.status();
  if (dims[0] != kImageRows || dims[1] != kImageCols) {
    return absl::DataLossError(absl::StrCat(path, ": images are ", dims[0], "x", dims[1],
                                            ", expected ", kImageRows, "x", kImageCols));
  }
  const size_t count = Limited(idx->count, limit);
  std::vector<uint8_t> pixels(count * kImagePixels);
  if (absl::Status s =
          ReadRecords(*idx, "pixels", pixels.data(), pixels.size(), count == idx->count);
      !s.ok()) {
    return s;
  }
  images->resize(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) (*images)[i] = pixels[i] / 255.0f;
  return idx->count;
}

// Reads labels, checking each is a class id; returns the declared count.
absl::StatusOr<uint32_t> ReadLabels(const std::string& path, size_t limit,
                                    std::vector<uint8_t>* labels) {
  std::vector<uint32_t> dims;
  absl::StatusOr<IdxFile> idx = OpenIdx(path, kLabelsMagic, &dims);
  if (!idx.ok()) return idx.status();
  labels->resize(Limited(idx->count, limit));
  if (absl::Status s =
          ReadRecords(*idx, "labels", labels->data(), labels->size(), labels->size() == idx->count);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < labels->size(); ++i) {
    if ((*labels)[i] >= kNumClasses) {
      return absl::DataLossError(absl::StrCat(path, ": label ", (*labels)[i], " at index ", i,
                                              " is not a class id in [0, ", kNumClasses, ")"));
    }
  }
  return idx->count;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) without modulo bias: values below 2^64 mod bound are
// rejected, so the accepted range holds a whole number of copies of [0, bound).
// REQUIRES: bound > 0.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // == 2^64 mod bound.
  uint64_t r;
  do {
    r = gen();
  } while (r < threshold);
  return r % bound;
}

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split, size_t limit) {
  const std::string prefix = absl::StrCat(dir, "/", split == Split::kTrain ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  Dataset data;
  absl::StatusOr<uint32_t> num_images = ReadImages(images_path, limit, &data.images);
  if (!num_images.ok()) return num_images.status();
  absl::StatusOr<uint32_t> num_labels = ReadLabels(labels_path, limit, &data.labels);
  if (!num_labels.ok()) return num_labels.status();
  if (*num_images != *num_labels) {
    return absl::DataLossError(absl::StrCat(images_path, " holds ", *num_images, " images but ",
                                            labels_path, " holds ", *num_labels, " labels"));
  }
  return data;
}

std::vector<uint32_t> ShardIndices(size_t n, int rank, int world, uint64_t seed, int epoch) {
  CHECK_GT(world, 0);
  CHECK_GE(rank, 0);
  CHECK_LT(rank, world);
  CHECK_LE(n, std::numeric_limits<uint32_t>::max());
  const uint64_t begin = uint64_t{static_cast<uint32_t>(rank)} * n / world;
  const uint64_t end = (uint64_t{static_cast<uint32_t>(rank)} + 1) * n / world;
  std::vector<uint32_t> indices(end - begin);
  std::iota(indices.begin(), indices.end(), static_cast<uint32_t>(begin));
  const uint64_t mixed = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(epoch)) ^
                                    static_cast<uint64_t>(rank));
  std::mt19937_64 gen(mixed);
  for (size_t i = indices.size(); i > 1; --i) {
    std::swap(indices[i - 1], indices[UniformBelow(gen, i)]);
  }
  return indices;
}

void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices,
                 std::vector<float>* images, std::vector<uint8_t>* labels) {
  images->resize(indices.size() * kImagePixels);
  labels->resize(indices.size());
  for (size_t b = 0; b < indices.size(); ++b) {
    const uint32_t i = indices[b];
    DCHECK_LT(i, data.size());
    std::copy_n(data.image(i), kImagePixels, images->data() + b * kImagePixels);
    (*labels)[b] = data.labels[i];
  }
}

}  // namespace shardps::train
