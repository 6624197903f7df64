// Name and shape of one flat fp32 parameter tensor, as a model lists them
// (e.g. Mlp::tensors()) for the parameter server to partition.
// A plain value type; thread safety as for any struct.
#ifndef SHARDPS_TOOLS_TRAIN_TENSOR_SHAPE_H_
#define SHARDPS_TOOLS_TRAIN_TENSOR_SHAPE_H_

#include <cstddef>
#include <string>
#include <vector>

namespace shardps::train {

struct TensorShape {
  std::string name;       // e.g. "fc1.weight".
  std::vector<int> dims;  // Row-major: {out, in} for a weight, {out} for a bias.
  size_t numel = 0;       // Product of dims.
};

}  // namespace shardps::train

#endif  // SHARDPS_TOOLS_TRAIN_TENSOR_SHAPE_H_
