// Fuzzes the cluster config where it enters: the text parser, "field=value"
// overrides (--set), and validation, as `shardps scheduler` runs them. A
// config that passes must print and parse back to itself, still pass, and be
// one a server can run (PartitionEngine::Create accepts it).
//
// Input: config text, then optionally a NUL byte and one override per line.
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_split.h"
#include "common/config.h"
#include "compression/codec_policy.h"
#include "server/partition_engine.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

absl::Status Admit(const ClusterConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  return compression::ValidateCompressionConfig(config);
}

void CheckAdmitted(const ClusterConfig& config) {
  std::string text;
  Require(google::protobuf::TextFormat::PrintToString(config, &text), "an admitted config does not print");
  auto again = ParseConfigText(text, "printed config");
  Require(again.ok(), "an admitted config, printed, does not parse");
  Require(google::protobuf::util::MessageDifferencer::Equals(*again, config),
          "an admitted config, printed and parsed, is another config");
  Require(Admit(*again).ok(), "an admitted config, printed and parsed, is refused");
  auto engine = PartitionEngine::Create(config, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
  Require(engine.ok(), "the scheduler admits a config that a server refuses");
}

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardps::fuzz::QuietProtobufLogs();
  using namespace shardps;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  auto config = ParseConfigText(input.substr(0, nul), "fuzz input");
  if (!config.ok()) {
    fuzz::Require(config.status().code() == absl::StatusCode::kInvalidArgument, "a parse error is not InvalidArgument");
    return 0;
  }
  if (nul != std::string::npos) {
    for (absl::string_view line : absl::StrSplit(absl::string_view(input).substr(nul + 1), '\n')) {
      if (!SetConfigField(&*config, line).ok()) return 0;
    }
  }
  if (fuzz::Admit(*config).ok()) fuzz::CheckAdmitted(*config);
  return 0;
}
