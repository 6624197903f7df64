// Building the TensorSpec a job declares (proto/cluster.proto).
#ifndef SHARDPS_COMMON_TENSOR_SPEC_H_
#define SHARDPS_COMMON_TENSOR_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/cluster.pb.h"

namespace shardps {

// A float32 tensor `name` of `shape` (outermost dimension first).
inline TensorSpec Float32Tensor(const std::string& name, const std::vector<int64_t>& shape) {
  TensorSpec t;
  t.set_name(name);
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(FLOAT32);
  return t;
}

// A float32 vector of n elements.
inline TensorSpec Float32Tensor(const std::string& name, int64_t n) {
  return Float32Tensor(name, std::vector<int64_t>{n});
}

}  // namespace shardps

#endif  // SHARDPS_COMMON_TENSOR_SPEC_H_
