// Which codec each partition uses on the wire under a cluster configuration.
// Workers and servers both call this, so they agree on every partition
// without negotiating; the chosen spec also travels in each data header and
// is checked by the receiver.
#ifndef SHARDPS_COMPRESSION_CODEC_POLICY_H_
#define SHARDPS_COMPRESSION_CODEC_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "proto/config.pb.h"

namespace shardps::compression {

// The codecs of one partition. A null codec means raw fp32 (codec "none",
// or a partition smaller than the codec's minimum size).
struct PartitionCodecs {
  std::unique_ptr<Codec> push;  // gradients, worker -> server
  std::unique_ptr<Codec> pull;  // answers, server -> worker
  std::string push_spec;        // canonical spec of `push`; empty when raw
  std::string pull_spec;        // canonical spec of `pull`; empty when raw
  // compression.warmup_codec for the warm-up rounds; null when raw.
  std::unique_ptr<Codec> warmup;
  std::string warmup_spec;
};

// The codec one message of a partition travels in. `codec` is borrowed from
// a PartitionCodecs, which must outlive it.
struct WireCodec {
  const Codec* codec = nullptr;  // null: raw fp32
  std::string spec;              // canonical spec, sent in the header; empty when raw
  bool raw() const { return codec == nullptr; }
};

// Which traffic of a round a WireCodec is asked for: the gradient pushed, or
// (sum-only mode) the aggregate of that round answered to the pull.
enum class Direction { kPush, kAggregate };

// Checks every codec spec of `config.compression()` and the combinations:
// async pulls carry whole weights, so only none, fp16 or bf16; the warm-up
// codec is none, fp16 or bf16.
absl::Status ValidateCompressionConfig(const ClusterConfig& config);

// Applies, for a lossy codec (2bit, onebit, topk) with Adam in sync mode,
// the measured configuration that keeps its accuracy (docs/performance.md,
// "Adam with a frozen variance"): update_mode SUM_ONLY, 150 uncompressed
// rounds in fp16 unless compression.warmup_codec is set, Adam's variance
// frozen after them, epsilon 1e-4 unless set, and for a bare "2bit" an
// adaptive threshold with onebit pulls unless a pull codec is set. A config that sets update_mode, compression.uncompressed_rounds or
// optimizer.freeze_variance_after is tuned by hand and left alone (so a
// second application changes nothing). Returns one line saying what was set,
// or why nothing could be; empty when there is nothing to say.
std::string ApplyCompressionRecipe(ClusterConfig* config);

// The codecs for a partition of `tensor` with `num_elements` values. A
// non-empty `declared_push_codec` (TensorSpec.codec) is the push codec,
// overriding the config's.
absl::StatusOr<PartitionCodecs> CodecsForPartition(const ClusterConfig& config, const std::string& tensor,
                                                   uint64_t num_elements,
                                                   const std::string& declared_push_codec = "");

// True when PUSH_PULL answers of `partition_codecs` carry compressed weight
// deltas: sync, update on server, and a pull codec. The server keeps a
// mirror of the weights the workers hold and sends quantise(w - mirror); the
// mirror carries the quantisation error to the next round (error feedback).
bool PullsWeightDeltas(const ClusterConfig& config, const PartitionCodecs& partition_codecs);

// True when `round` of a partition is a warm-up round
// (compression.uncompressed_rounds): its push, and in sum-only mode the
// aggregate answered for it, skip the lossy codec and travel raw or in
// compression.warmup_codec (RoundCodec says which).
inline bool RoundUncompressed(const ClusterConfig& config, uint64_t round) {
  return round < config.compression().uncompressed_rounds();
}

// The codec `round` of a partition travels in, in `direction`: the
// configured push or pull codec, or in a warm-up round the warm-up codec
// (raw when none). Traffic configured raw stays raw. Workers and servers both
// call this, so they agree on every round without negotiating.
WireCodec RoundCodec(const ClusterConfig& config, const PartitionCodecs& codecs, Direction direction,
                     uint64_t round);

// Seed shared by every worker and the server for (partition, round), so
// randomk picks the same indices everywhere and servers can sum payloads.
uint64_t CodecSeed(uint64_t partition_id, uint64_t round);

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_POLICY_H_
