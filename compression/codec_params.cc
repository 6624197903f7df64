#include "compression/codec_params.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace shardps::compression {
namespace {

// Keys accepted per codec, besides the universal "threads".
std::vector<std::string> KeysFor(const std::string& name) {
  if (name == "2bit") return {"threshold", "scale", "threads"};
  if (name == "topk") return {"ratio", "threads"};
  if (name == "randomk") return {"ratio", "unbiased", "threads"};
  return {"threads"};
}

bool IsKnownName(std::string_view name) {
  for (const std::string& n : CodecNames()) {
    if (n == name) return true;
  }
  return false;
}

// Abseil here has its own string_view; bridge from std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status BadValue(std::string_view spec, std::string_view part, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("codec spec \"", Av(spec), "\": bad value in \"", Av(part), "\": expected ", Av(want)));
}

absl::Status ApplyKey(std::string_view spec, std::string_view part, std::string_view key,
                      std::string_view value, CodecParams& p) {
  const absl::string_view v(value.data(), value.size());
  if (key == "threshold") {
    if (!absl::SimpleAtof(v, &p.threshold)) return BadValue(spec, part, "a number");
  } else if (key == "scale") {
    if (!absl::SimpleAtof(v, &p.scale)) return BadValue(spec, part, "a number");
  } else if (key == "ratio") {
    if (!absl::SimpleAtof(v, &p.ratio)) return BadValue(spec, part, "a number");
  } else if (key == "unbiased") {
    if (v != "0" && v != "1") return BadValue(spec, part, "0 or 1");
    p.unbiased = v == "1";
  } else if (key == "threads") {
    if (!absl::SimpleAtoi(v, &p.num_threads)) return BadValue(spec, part, "an integer");
  }
  return absl::OkStatus();
}

absl::Status ParseKeyValues(std::string_view spec, std::string_view rest, CodecParams& p) {
  const std::vector<std::string> allowed = KeysFor(p.name);
  for (absl::string_view part : absl::StrSplit(absl::string_view(rest.data(), rest.size()), ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    bool known = false;
    for (const std::string& k : allowed) known = known || (kv[0] == k);
    if (kv.size() != 2 || !known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "codec spec \"", Av(spec), "\": bad parameter \"", part, "\"; codec ", p.name,
          " accepts ", absl::StrJoin(allowed, ", "), " as key=value"));
    }
    SHARDPS_RETURN_IF_ERROR(ApplyKey(spec, std::string_view(part.data(), part.size()),
                                     std::string_view(kv[0].data(), kv[0].size()),
                                     std::string_view(kv[1].data(), kv[1].size()), p));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& CodecNames() {
  static const std::vector<std::string> kNames = {"none", "fp16", "bf16",   "2bit",
                                                  "onebit", "topk", "randomk"};
  return kNames;
}

std::string CodecParams::ToString() const {
  std::string s = name;
  if (name == "2bit") {
    absl::StrAppend(&s, scale > 0 ? absl::StrCat(":scale=", scale) : absl::StrCat(":threshold=", threshold));
  }
  if (name == "topk" || name == "randomk") absl::StrAppend(&s, ":ratio=", ratio);
  if (name == "randomk") absl::StrAppend(&s, ",unbiased=", unbiased ? 1 : 0);
  if (num_threads != 0) {
    absl::StrAppend(&s, s.find(':') == std::string::npos ? ":" : ",", "threads=", num_threads);
  }
  return s;
}

absl::Status ValidateCodecParams(const CodecParams& p) {
  if (!IsKnownName(p.name)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown codec \"", p.name,
                                                   "\"; known codecs: ",
                                                   absl::StrJoin(CodecNames(), ", ")));
  }
  if (p.name == "2bit" && !(std::isfinite(p.threshold) && p.threshold > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("2bit threshold must be finite and > 0, got ", p.threshold));
  }
  if (p.name == "2bit" && !(std::isfinite(p.scale) && p.scale >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("2bit scale must be finite and >= 0, got ", p.scale));
  }
  if ((p.name == "topk" || p.name == "randomk") && !(p.ratio > 0 && p.ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.name, " ratio must be in (0, 1], got ", p.ratio));
  }
  if (p.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be >= 0 (0 = all cores), got ", p.num_threads));
  }
  return absl::OkStatus();
}

absl::StatusOr<CodecParams> ParseCodecSpec(std::string_view spec) {
  CodecParams p;
  const size_t colon = spec.find(':');
  p.name = std::string(spec.substr(0, colon));
  if (!IsKnownName(p.name)) {
    return absl::InvalidArgumentError(absl::StrCat("codec spec \"", Av(spec), "\": unknown codec \"",
                                                   p.name, "\"; known codecs: ",
                                                   absl::StrJoin(CodecNames(), ", ")));
  }
  if (colon != std::string_view::npos) {
    SHARDPS_RETURN_IF_ERROR(ParseKeyValues(spec, spec.substr(colon + 1), p));
  }
  absl::Status valid = ValidateCodecParams(p);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec spec \"", Av(spec), "\": ", valid.message()));
  }
  return p;
}

}  // namespace shardps::compression
