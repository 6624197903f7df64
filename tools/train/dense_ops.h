// Internal to tools/train: the fp32 kernels of a dense (fully connected)
// layer, each over a half-open range of output rows so a caller can split the
// rows among threads. Every output element is computed by one fixed loop
// order whatever the range split, so results are bitwise identical for any
// thread count. Loops run i-k-j with a contiguous innermost loop that the
// compiler vectorises without reassociating (no -ffast-math needed).
//
// Zero inputs / zero upstream gradients are skipped (ReLU zeros, blank
// pixels); for finite values that changes nothing but, at most, the sign of
// a zero result.
//
// Thread safety: pure functions; concurrent calls must write disjoint rows.
#ifndef SHARDPS_TOOLS_TRAIN_DENSE_OPS_H_
#define SHARDPS_TOOLS_TRAIN_DENSE_OPS_H_

namespace shardps::train {

// wt (in x out) = transpose of w (out x in).
void TransposeWeights(const float* w, int out, int in, float* wt);

// For rows r in [r0, r1): y[r,:] = bias + sum_k x[r,k] * wt[k,:], then
// max(0, .) if relu. x: rows x in, wt: in x out, y: rows x out.
void AffineRows(const float* x, const float* wt, const float* bias, int in, int out, bool relu,
                int r0, int r1, float* y);

// For rows r in [r0, r1): dx[r,:] = sum_o dy[r,o] * w[o,:], then zeroed where
// act[r,:] <= 0 (the ReLU that produced the layer input act; nullptr: none).
// dy: rows x out, w: out x in, dx and act: rows x in.
void BackpropInputRows(const float* dy, const float* w, const float* act, int out, int in, int r0,
                       int r1, float* dx);

// For output units o in [o0, o1): dw[o,:] = sum_b dy[b,o] * x[b,:] and
// db[o] = sum_b dy[b,o], summed over b = 0..batch-1 in order.
// dy: batch x out, x: batch x in, dw: out x in, db: out.
void WeightGradRows(const float* dy, const float* x, int batch, int out, int in, int o0, int o1,
                    float* dw, float* db);

}  // namespace shardps::train

#endif  // SHARDPS_TOOLS_TRAIN_DENSE_OPS_H_
