#include "compression/codec_policy.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardps::compression {
namespace {

// The codec for `spec` with `n` values, or null for raw fp32.
absl::Status Resolve(const std::string& spec, uint64_t n, std::unique_ptr<Codec>* codec, std::string* canonical) {
  auto params = ParseCodecSpec(spec);
  if (!params.ok()) return params.status();
  if (params->name == "none") return absl::OkStatus();
  auto c = CreateCodec(*params);
  if (!c.ok()) return c.status();
  if (n < (*c)->min_elements()) return absl::OkStatus();
  *canonical = params->ToString();
  *codec = *std::move(c);
  return absl::OkStatus();
}

absl::Status Named(absl::Status s, const std::string& field) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("config field '", field, "': ", s.message()));
}

}  // namespace

absl::Status ValidateCompressionConfig(const ClusterConfig& config) {
  const CompressionConfig& c = config.compression();
  if (absl::Status s = ParseCodecSpec(c.codec()).status(); !s.ok()) return Named(s, "compression.codec");
  for (const auto& [tensor, spec] : c.tensor_codecs()) {
    if (absl::Status s = ParseCodecSpec(spec).status(); !s.ok()) {
      return Named(s, absl::StrCat("compression.tensor_codecs[", tensor, "]"));
    }
  }
  auto warmup = ParseCodecSpec(c.warmup_codec());
  if (!warmup.ok()) return Named(warmup.status(), "compression.warmup_codec");
  if (warmup->name != "none" && warmup->name != "fp16" && warmup->name != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("config field 'compression.warmup_codec': '", c.warmup_codec(),
                                                   "' is not allowed; allowed: none, fp16, bf16 (the warm-up "
                                                   "rounds learn Adam's variance from near-exact gradients)"));
  }
  auto pull = ParseCodecSpec(c.pull_codec());
  if (!pull.ok()) return Named(pull.status(), "compression.pull_codec");
  if (config.update_mode() == UPDATE_ON_SERVER && config.consistency() != SYNC && pull->name != "none" &&
      pull->name != "fp16" && pull->name != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field 'compression.pull_codec': '", c.pull_codec(),
        "' cannot carry weights; allowed with consistency async or ssp: none, fp16, bf16 (in sync mode any codec "
        "compresses the weight deltas, which needs every worker to receive every round once)"));
  }
  if (config.update_mode() == SUM_ONLY && pull->name == "2bit" && pull->scale > 0) {
    // Measured: the threshold grows with the server's own residual and the
    // run diverges (docs/performance.md); a fixed threshold or onebit is fine.
    return absl::InvalidArgumentError(absl::StrCat(
        "config field 'compression.pull_codec': '", c.pull_codec(),
        "' (adaptive 2bit threshold) diverges on the servers' compressed aggregate in sum-only mode; use "
        "onebit or a fixed threshold (2bit:threshold=T)"));
  }
  if (!(c.momentum() >= 0 && c.momentum() < 1)) {
    return absl::InvalidArgumentError("config field 'compression.momentum' must be in [0, 1)");
  }
  const uint64_t freeze = config.optimizer().freeze_variance_after();
  bool compresses_pushes = ParseCodecSpec(c.codec())->name != "none";
  for (const auto& [tensor, spec] : c.tensor_codecs()) compresses_pushes |= ParseCodecSpec(spec)->name != "none";
  if (config.update_mode() == SUM_ONLY && compresses_pushes && freeze > c.uncompressed_rounds()) {
    // Sum-only workers compress in Adam's frozen coordinates from the freeze
    // on; a residual kept in gradient units before it would not carry over.
    return absl::InvalidArgumentError(absl::StrCat(
        "config field 'compression.uncompressed_rounds' (", c.uncompressed_rounds(),
        ") must be >= optimizer.freeze_variance_after (", freeze,
        ") in sum-only mode: compressed rounds before the freeze would leave error-feedback residuals in "
        "gradient units"));
  }
  const bool one_bit_adam = config.update_mode() == SUM_ONLY && compresses_pushes && freeze > 0 &&
                            config.optimizer().kind() == OptimizerConfig::ADAM;
  if (one_bit_adam && c.momentum() > 0) {
    // The workers already compress Adam's momentum; DGC's would add another.
    return absl::InvalidArgumentError(
        "config field 'compression.momentum' must be 0 with optimizer.freeze_variance_after and compressed "
        "pushes in sum-only mode: the workers compress Adam's momentum already");
  }
  if (one_bit_adam && config.optimizer().weight_decay() != 0) {
    // The workers' momenta travel in units of the frozen variance; the decay
    // term would need each worker's weights folded into them.
    return absl::InvalidArgumentError(
        "config field 'optimizer.weight_decay' must be 0 with optimizer.freeze_variance_after and compressed "
        "pushes in sum-only mode (1-bit Adam); use update_mode UPDATE_ON_SERVER for weight decay");
  }
  return absl::OkStatus();
}

std::string ApplyCompressionRecipe(ClusterConfig* config) {
  CompressionConfig& c = *config->mutable_compression();
  auto push = ParseCodecSpec(c.codec());
  if (!push.ok() || (push->name != "2bit" && push->name != "onebit" && push->name != "topk")) return "";
  const std::string what = absl::StrCat("compression '", c.codec(), "' ");
  const OptimizerConfig& o = config->optimizer();
  if (o.kind() != OptimizerConfig::ADAM) return "";  // linear updates keep error feedback exact
  if (config->consistency() != SYNC) {
    return absl::StrCat(what, "with Adam under ", absl::AsciiStrToLower(Consistency_Name(config->consistency())),
                        " consistency: no measured recipe keeps its accuracy there (it needs update_mode sum_only, "
                        "which is sync only); expect a loss (docs/performance.md)");
  }
  if (config->has_update_mode() || c.has_uncompressed_rounds() || o.has_freeze_variance_after()) {
    // Tuned by hand (or the recipe applied already): a partial recipe is a
    // combination nobody measured.
    return "";
  }
  if (o.weight_decay() != 0 || c.momentum() != 0) {
    return what + "with Adam: the accuracy recipe (1-bit Adam) needs optimizer.weight_decay and "
                  "compression.momentum 0, so it is not applied; expect a loss (docs/performance.md)";
  }
  constexpr uint32_t kWarmupRounds = 150;
  std::vector<std::string> set = {"update_mode=SUM_ONLY",
                                  absl::StrCat("compression.uncompressed_rounds=", kWarmupRounds),
                                  absl::StrCat("optimizer.freeze_variance_after=", kWarmupRounds)};
  config->set_update_mode(SUM_ONLY);
  c.set_uncompressed_rounds(kWarmupRounds);
  OptimizerConfig& opt = *config->mutable_optimizer();
  opt.set_freeze_variance_after(kWarmupRounds);
  if (!opt.has_epsilon()) {
    // A frozen variance with epsilon 1e-8 lets a coordinate whose gradient
    // grows after the freeze take unbounded steps.
    opt.set_epsilon(1e-4f);
    set.push_back("optimizer.epsilon=0.0001");
  }
  if (!c.has_warmup_codec()) {
    // Measured: fp16 warm-up rounds keep every codec within its bar and
    // halve the warm-up's bytes (docs/performance.md).
    c.set_warmup_codec("fp16");
    set.push_back("compression.warmup_codec=fp16");
  }
  if (push->name == "2bit" && c.codec().find(':') == std::string::npos) {
    // Measured best: scale 1 with onebit pulls; scale 0.25 with raw pulls.
    const bool pull_onebit = !c.has_pull_codec();
    c.set_codec(pull_onebit ? "2bit:scale=1" : "2bit:scale=0.25");
    set.push_back(absl::StrCat("compression.codec=", c.codec()));
    if (pull_onebit) {
      c.set_pull_codec("onebit");
      set.push_back("compression.pull_codec=onebit");
    }
  }
  return absl::StrCat(what, "with Adam: applying the measured accuracy recipe (docs/performance.md): ",
                      absl::StrJoin(set, ", "),
                      "; setting update_mode, compression.uncompressed_rounds or optimizer.freeze_variance_after "
                      "yourself turns it off");
}

absl::StatusOr<PartitionCodecs> CodecsForPartition(const ClusterConfig& config, const std::string& tensor,
                                                   uint64_t num_elements, const std::string& declared_push_codec) {
  const CompressionConfig& c = config.compression();
  auto it = c.tensor_codecs().find(tensor);
  const std::string& configured = it != c.tensor_codecs().end() ? it->second : c.codec();
  const std::string& push_spec = declared_push_codec.empty() ? configured : declared_push_codec;
  PartitionCodecs codecs;
  if (absl::Status s = Resolve(push_spec, num_elements, &codecs.push, &codecs.push_spec); !s.ok()) return s;
  if (absl::Status s = Resolve(c.pull_codec(), num_elements, &codecs.pull, &codecs.pull_spec); !s.ok()) return s;
  if (absl::Status s = Resolve(c.warmup_codec(), num_elements, &codecs.warmup, &codecs.warmup_spec); !s.ok()) {
    return s;
  }
  return codecs;
}

WireCodec RoundCodec(const ClusterConfig& config, const PartitionCodecs& codecs, Direction direction,
                     uint64_t round) {
  const bool push = direction == Direction::kPush;
  WireCodec configured{push ? codecs.push.get() : codecs.pull.get(), push ? codecs.push_spec : codecs.pull_spec};
  if (configured.raw() || !RoundUncompressed(config, round)) return configured;
  return WireCodec{codecs.warmup.get(), codecs.warmup_spec};
}

bool PullsWeightDeltas(const ClusterConfig& config, const PartitionCodecs& partition_codecs) {
  return config.consistency() == SYNC && config.update_mode() == UPDATE_ON_SERVER &&
         partition_codecs.pull != nullptr;
}

uint64_t CodecSeed(uint64_t partition_id, uint64_t round) {
  uint64_t z = partition_id * 0x9E3779B97F4A7C15ull + round + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace shardps::compression
