#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace shardps {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Collects the parser's messages instead of printing them to stderr.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    errors_.push_back(absl::StrCat("line ", line + 1, ":", column + 1, ": ", message));
  }
  std::string Joined() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::vector<std::string> errors_;
};

std::string AllowedValues(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() == 0 && absl::StrContains(e->value(i)->name(), "UNSPECIFIED")) continue;
    names.push_back(absl::AsciiStrToLower(e->value(i)->name()));
  }
  return absl::StrJoin(names, ", ");
}

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config field '", field, "' ", problem));
}

absl::Status CheckPositiveFinite(absl::string_view field, float v) {
  if (!(v > 0) || !std::isfinite(v)) return Invalid(field, absl::StrCat("must be > 0, got ", v));
  return absl::OkStatus();
}

absl::Status CheckUnit(absl::string_view field, float v, bool inclusive_low) {
  bool ok = inclusive_low ? (v >= 0 && v < 1) : (v > 0 && v < 1);
  if (!ok) return Invalid(field, absl::StrCat("must be in ", inclusive_low ? "[0" : "(0", ", 1), got ", v));
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const OptimizerConfig& o) {
  if (!OptimizerConfig::Kind_IsValid(o.kind())) {
    return Invalid("optimizer.kind", absl::StrCat("allowed: ", AllowedValues(OptimizerConfig::Kind_descriptor())));
  }
  if (absl::Status s = CheckPositiveFinite("optimizer.learning_rate", o.learning_rate()); !s.ok()) return s;
  if (absl::Status s = CheckUnit("optimizer.momentum", o.momentum(), true); !s.ok()) return s;
  if (absl::Status s = CheckUnit("optimizer.beta1", o.beta1(), true); !s.ok()) return s;
  if (absl::Status s = CheckUnit("optimizer.beta2", o.beta2(), true); !s.ok()) return s;
  if (absl::Status s = CheckPositiveFinite("optimizer.epsilon", o.epsilon()); !s.ok()) return s;
  if (!(o.weight_decay() >= 0) || !std::isfinite(o.weight_decay())) {
    return Invalid("optimizer.weight_decay", absl::StrCat("must be >= 0, got ", o.weight_decay()));
  }
  if (o.freeze_variance_after() > 0 && o.kind() != OptimizerConfig::ADAM) {
    return Invalid("optimizer.freeze_variance_after",
                   absl::StrCat("freezes Adam's second moment; optimizer.kind is ",
                                OptimizerConfig::Kind_Name(o.kind())));
  }
  const LearningRateSchedule& s = o.schedule();
  if (s.kind() == LearningRateSchedule::STEP) {
    if (s.step_size() == 0) return Invalid("optimizer.schedule.step_size", "must be > 0 for a step schedule");
    if (absl::Status st = CheckUnit("optimizer.schedule.gamma", s.gamma(), false); !st.ok()) return st;
  }
  if (s.kind() == LearningRateSchedule::COSINE && s.total_steps() == 0) {
    return Invalid("optimizer.schedule.total_steps", "must be > 0 for a cosine schedule");
  }
  if (!(s.min_lr() >= 0) || s.min_lr() > o.learning_rate()) {
    return Invalid("optimizer.schedule.min_lr", "must be in [0, optimizer.learning_rate]");
  }
  return absl::OkStatus();
}

// Walks "a.b.c" to the message holding the last field. Only a read (M is
// const) may end on a repeated field: a flag cannot set one.
template <typename M>
absl::StatusOr<std::pair<M*, const FieldDescriptor*>> Resolve(M* root, absl::string_view path) {
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  M* msg = root;
  for (size_t i = 0; i < parts.size(); ++i) {
    const FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(parts[i]);
    const bool last = i + 1 == parts.size();
    if (f == nullptr || (f->is_repeated() && !(last && std::is_const_v<M>))) {
      std::vector<std::string> names;
      for (int j = 0; j < msg->GetDescriptor()->field_count(); ++j) names.push_back(msg->GetDescriptor()->field(j)->name());
      return absl::InvalidArgumentError(absl::StrCat("unknown config field '", path, "' (in ",
                                                     msg->GetDescriptor()->name(), ": ", absl::StrJoin(names, ", "), ")"));
    }
    if (last) return std::make_pair(msg, f);
    if (f->type() != FieldDescriptor::TYPE_MESSAGE) {
      return absl::InvalidArgumentError(absl::StrCat("config field '", parts[i], "' in '", path, "' is not a message"));
    }
    if constexpr (std::is_const_v<M>) {
      msg = &msg->GetReflection()->GetMessage(*msg, f);
    } else {
      msg = msg->GetReflection()->MutableMessage(msg, f);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("empty config field path in '", path, "'"));
}

}  // namespace

absl::StatusOr<ClusterConfig> ParseConfigText(absl::string_view text, absl::string_view origin) {
  ClusterConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse config ", origin, ": ", errors.Joined()));
  }
  return config;
}

absl::StatusOr<ClusterConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path, ": ", std::strerror(errno)));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseConfigText(buf.str(), path);
}

uint32_t EffectiveReplication(const ClusterConfig& config) {
  if (config.replication() > 0) return config.replication();
  return config.num_servers() >= 2 ? 2 : 1;
}

absl::Status ValidateConfig(const ClusterConfig& c) {
  if (c.consistency() == CONSISTENCY_UNSPECIFIED || !Consistency_IsValid(c.consistency())) {
    return Invalid("consistency", absl::StrCat("allowed: ", AllowedValues(Consistency_descriptor())));
  }
  if (c.num_servers() < 1 || c.num_servers() > kMaxServers) {
    return Invalid("num_servers", absl::StrCat("must be in [1, ", kMaxServers, "]"));
  }
  if (c.num_workers() < 1 || c.num_workers() > 65536) return Invalid("num_workers", "must be in [1, 65536]");
  if (c.partition_bytes() < 4 || c.partition_bytes() > (1ull << 30) || c.partition_bytes() % 4 != 0) {
    return Invalid("partition_bytes", "must be a multiple of 4 in [4, 1 GiB]");
  }
  if (c.deterministic() && !RoundBased(c)) {
    return Invalid("deterministic", "applies only to consistency sync, or ssp in rounds (ssp_in_rounds: true, or "
                                    "staleness 0): ssp applies pushes as they arrive");
  }
  if (c.consistency() != SSP && c.staleness() != 0) {
    return Invalid("staleness", "applies only to consistency: ssp");
  }
  if (c.consistency() != SSP && c.ssp_in_rounds()) {
    return Invalid("ssp_in_rounds", "applies only to consistency: ssp");
  }
  if (c.staleness() > kMaxStaleness) {
    return Invalid("staleness", absl::StrCat("must be at most ", kMaxStaleness,
                                             " (servers hold the pushes of rounds not yet complete)"));
  }
  if (c.replication() > c.num_servers()) {
    return Invalid("replication", absl::StrCat("must be at most num_servers (", c.num_servers(),
                                               "): each copy lives on its own server"));
  }
  if (c.update_mode() == SUM_ONLY && c.consistency() != SYNC) {
    return Invalid("update_mode", "sum_only applies only to consistency: sync (workers apply every round's "
                                  "aggregate once, in order; ssp and async answer with weights)");
  }
  if (c.rendezvous_timeout_ms() == 0) return Invalid("rendezvous_timeout_ms", "must be > 0");
  if (c.request_timeout_ms() == 0) return Invalid("request_timeout_ms", "must be > 0");
  if (c.heartbeat_interval_ms() == 0) return Invalid("heartbeat_interval_ms", "must be > 0");
  if (c.heartbeat_timeout_ms() <= c.heartbeat_interval_ms()) {
    return Invalid("heartbeat_timeout_ms", "must be greater than heartbeat_interval_ms");
  }
  if (absl::Status s = ValidateCheckpointConfig(c); !s.ok()) return s;
  if (absl::Status s = ValidateLimits(c.limits()); !s.ok()) return s;
  return ValidateOptimizer(c.optimizer());
}

absl::Status SetConfigField(ClusterConfig* config, absl::string_view assignment) {
  std::vector<std::string> kv = absl::StrSplit(assignment, absl::MaxSplits('=', 1));
  if (kv.size() != 2 || kv[0].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("config override '", assignment, "' is not field=value"));
  }
  auto resolved = Resolve<Message>(config, kv[0]);
  if (!resolved.ok()) return resolved.status();
  auto [msg, field] = *resolved;
  const Reflection* r = msg->GetReflection();
  const std::string& v = kv[1];
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", kv[0], "': '", v, "' is not ", what));
  };
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool b;
      if (!absl::SimpleAtob(v, &b)) return bad("a boolean");
      r->SetBool(msg, field, b);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t x;
      if (!absl::SimpleAtoi(v, &x)) return bad("an unsigned integer");
      r->SetUInt32(msg, field, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t x;
      if (!absl::SimpleAtoi(v, &x)) return bad("an unsigned integer");
      r->SetUInt64(msg, field, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      float x;
      if (!absl::SimpleAtof(v, &x)) return bad("a number");
      r->SetFloat(msg, field, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* value = field->enum_type()->FindValueByName(absl::AsciiStrToUpper(v));
      if (value == nullptr) return bad(absl::StrCat("one of: ", AllowedValues(field->enum_type())));
      r->SetEnum(msg, field, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(msg, field, v);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("config field '", kv[0], "' cannot be set from a flag"));
  }
}

absl::StatusOr<std::string> GetConfigField(const ClusterConfig& config, absl::string_view path) {
  auto resolved = Resolve<const Message>(&config, path);
  if (!resolved.ok()) return resolved.status();
  auto [msg, field] = *resolved;
  const Reflection* r = msg->GetReflection();
  std::string out;
  if (field->is_map()) {
    // The only map is compression.tensor_codecs (string to string).
    std::vector<std::string> entries;
    for (int i = 0; i < r->FieldSize(*msg, field); ++i) {
      const Message& entry = r->GetRepeatedMessage(*msg, field, i);
      const Reflection* er = entry.GetReflection();
      const Descriptor* d = entry.GetDescriptor();
      entries.push_back(absl::StrCat(er->GetString(entry, d->map_key()), "=", er->GetString(entry, d->map_value())));
    }
    std::sort(entries.begin(), entries.end());
    for (const std::string& e : entries) absl::StrAppend(&out, e, "\n");
    return out;
  }
  if (field->is_repeated()) {
    // One element a line (security.accepted_tokens, say; the scheduler hands
    // out no security block, so that one reads empty).
    for (int i = 0; i < r->FieldSize(*msg, field); ++i) {
      std::string element;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        element = r->GetRepeatedString(*msg, field, i);
      } else {
        google::protobuf::TextFormat::PrintFieldValueToString(*msg, field, i, &element);
      }
      absl::StrAppend(&out, element, "\n");
    }
    return out;
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    google::protobuf::TextFormat::PrintToString(r->GetMessage(*msg, field), &out);
    return out;
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) return r->GetString(*msg, field);
  // Unset fields read as their defaults: the value the cluster runs with.
  google::protobuf::TextFormat::PrintFieldValueToString(*msg, field, -1, &out);
  return out;
}

absl::Status ValidateLimits(const ResourceLimits& l) {
  if (l.max_model_bytes() == 0) return Invalid("limits.max_model_bytes", "must be > 0");
  if (l.max_inflight_bytes_per_worker() == 0) return Invalid("limits.max_inflight_bytes_per_worker", "must be > 0");
  if (l.socket_send_hwm() == 0 || l.socket_send_hwm() > 1000000) {
    return Invalid("limits.socket_send_hwm", "must be in [1, 1000000] messages");
  }
  if (l.socket_receive_hwm() == 0 || l.socket_receive_hwm() > 1000000) {
    return Invalid("limits.socket_receive_hwm", "must be in [1, 1000000] messages");
  }
  if (l.max_connections_per_server() == 0) return Invalid("limits.max_connections_per_server", "must be > 0");
  if (l.max_connections_per_address() == 0) return Invalid("limits.max_connections_per_address", "must be > 0");
  return absl::OkStatus();
}

absl::Status ValidateCheckpointConfig(const ClusterConfig& c, bool on_request) {
  const CheckpointConfig& k = c.checkpoint();
  const bool writes = !k.dir().empty();
  const bool restores = !k.restore_dir().empty() || k.restore_round() > 0;
  if (!writes && !restores) {
    if (k.every_rounds() > 0) return Invalid("checkpoint.every_rounds", "needs checkpoint.dir");
    return absl::OkStatus();
  }
  const absl::string_view field = writes ? "checkpoint.dir" : "checkpoint.restore_dir";
  if (writes && k.every_rounds() == 0) {
    return Invalid("checkpoint.every_rounds", "must be >= 1 when checkpoint.dir is set");
  }
  if (restores && (k.restore_dir().empty() || k.restore_round() == 0)) {
    return Invalid("checkpoint.restore_dir",
                   "and checkpoint.restore_round are set together (shardps scheduler --restore)");
  }
  // Async and ssp applied on arrival: each partition at the version it has
  // when the request reaches its primary (no round at which every
  // partition's state agrees, so no periodic checkpoints); ssp in rounds
  // holds pushes of later rounds that a checkpoint does not.
  const bool on_arrival = !RoundBased(c);
  if (on_arrival && writes && !on_request) {
    return Invalid(field, absl::StrCat("in ", c.consistency() == ASYNC ? "async" : "ssp (applied on arrival)",
                                       " is written on request only (shardps checkpoint): pushes are applied as "
                                       "they arrive, so no round is one at which every partition's state agrees"));
  }
  if (c.consistency() == SSP && !on_arrival && c.staleness() > 0) {
    return Invalid(field, "needs consistency: sync, async or ssp applied on arrival (ssp_in_rounds holds pushes "
                          "of later rounds that a checkpoint does not)");
  }
  if (c.update_mode() == SUM_ONLY) {
    return Invalid(field, "cannot be used with update_mode: sum_only (the weights and optimizer state live on the "
                          "workers, which a server checkpoint does not hold)");
  }
  const CompressionConfig& z = c.compression();
  const auto raw = [](const std::string& spec) { return spec.empty() || spec == "none"; };
  if (!raw(z.codec()) || !raw(z.pull_codec()) || !z.tensor_codecs().empty()) {
    return Invalid(field, "cannot be used with compression (error-feedback residuals and codec state live on the "
                          "workers, which a server checkpoint does not hold)");
  }
  return absl::OkStatus();
}

int SilentConnectionMs(const ClusterConfig& config) {
  return static_cast<int>(std::max(config.heartbeat_timeout_ms(), config.request_timeout_ms()));
}

bool RoundBased(const ClusterConfig& config) {
  if (config.consistency() == SSP) return config.staleness() == 0 || config.ssp_in_rounds();
  return config.consistency() == SYNC;
}

std::string ApplyAsyncMomentumDefault(ClusterConfig* config) {
  const OptimizerConfig& o = config->optimizer();
  if (config->consistency() != ASYNC || o.kind() != OptimizerConfig::ADAM || o.has_beta1() ||
      config->num_workers() < kAsyncMomentumFreeWorkers) {
    return "";  // and the config untouched, down to which messages it has
  }
  config->mutable_optimizer()->set_beta1(0);
  return absl::StrCat("async with Adam and ", config->num_workers(),
                      " workers: optimizer.beta1=0 (asynchrony acts as momentum; measured in "
                      "docs/performance.md); setting optimizer.beta1 yourself turns it off");
}

uint32_t StalenessBound(const ClusterConfig& config) {
  return config.consistency() == SSP ? config.staleness() : 0;
}

std::string ConsistencyName(Consistency c) { return absl::AsciiStrToLower(Consistency_Name(c)); }

}  // namespace shardps
