#include "tools/train/dense_ops.h"

#include <cstddef>

namespace shardps::train {
namespace {

// dst[0..n) += a * src[0..n); the loop every kernel vectorises.
inline void AddScaled(float a, const float* __restrict src, int n, float* __restrict dst) {
  for (int j = 0; j < n; ++j) dst[j] += a * src[j];
}

inline void Fill(float value, int n, float* dst) {
  for (int j = 0; j < n; ++j) dst[j] = value;
}

}  // namespace

void TransposeWeights(const float* w, int out, int in, float* wt) {
  constexpr int kBlock = 32;  // Keeps both sides of the copy in cache.
  for (int o0 = 0; o0 < out; o0 += kBlock) {
    for (int i0 = 0; i0 < in; i0 += kBlock) {
      for (int o = o0; o < o0 + kBlock && o < out; ++o) {
        for (int i = i0; i < i0 + kBlock && i < in; ++i) {
          wt[static_cast<size_t>(i) * out + o] = w[static_cast<size_t>(o) * in + i];
        }
      }
    }
  }
}

void AffineRows(const float* x, const float* wt, const float* bias, int in, int out, bool relu,
                int r0, int r1, float* y) {
  for (int r = r0; r < r1; ++r) {
    const float* xr = x + static_cast<size_t>(r) * in;
    float* yr = y + static_cast<size_t>(r) * out;
    for (int j = 0; j < out; ++j) yr[j] = bias[j];
    for (int k = 0; k < in; ++k) {
      if (xr[k] != 0.0f) AddScaled(xr[k], wt + static_cast<size_t>(k) * out, out, yr);
    }
    if (relu) {
      for (int j = 0; j < out; ++j) yr[j] = yr[j] > 0.0f ? yr[j] : 0.0f;
    }
  }
}

void BackpropInputRows(const float* dy, const float* w, const float* act, int out, int in, int r0,
                       int r1, float* dx) {
  for (int r = r0; r < r1; ++r) {
    const float* dyr = dy + static_cast<size_t>(r) * out;
    float* dxr = dx + static_cast<size_t>(r) * in;
    Fill(0.0f, in, dxr);
    for (int o = 0; o < out; ++o) {
      if (dyr[o] != 0.0f) AddScaled(dyr[o], w + static_cast<size_t>(o) * in, in, dxr);
    }
    if (act != nullptr) {
      const float* ar = act + static_cast<size_t>(r) * in;
      for (int i = 0; i < in; ++i) dxr[i] = ar[i] > 0.0f ? dxr[i] : 0.0f;
    }
  }
}

void WeightGradRows(const float* dy, const float* x, int batch, int out, int in, int o0, int o1,
                    float* dw, float* db) {
  for (int o = o0; o < o1; ++o) {
    float* dwo = dw + static_cast<size_t>(o) * in;
    Fill(0.0f, in, dwo);
    float bias_grad = 0.0f;
    for (int b = 0; b < batch; ++b) {
      const float g = dy[static_cast<size_t>(b) * out + o];
      bias_grad += g;
      if (g != 0.0f) AddScaled(g, x + static_cast<size_t>(b) * in, in, dwo);
    }
    db[o] = bias_grad;
  }
}

}  // namespace shardps::train
