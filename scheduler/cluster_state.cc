#include "scheduler/cluster_state.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/protocol.h"
#include "scheduler/shard_assignment.h"

namespace shardps {
namespace {

absl::Status CheckVersion(const RegisterRequest& r) {
  if (r.protocol_version() == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("protocol version ", r.protocol_version(), " of ",
                                                    r.host(), " is not supported (scheduler speaks ",
                                                    kProtocolVersion, ")"));
}

std::string DescribeTensor(const TensorSpec& t) {
  return absl::StrCat("'", t.name(), "' [", absl::StrJoin(t.shape(), "x"), "]");
}

}  // namespace

ClusterState::ClusterState(ClusterConfig config, Clock clock)
    : config_(std::move(config)), clock_(std::move(clock)) {}

absl::StatusOr<RegisterResponse> ClusterState::RegisterServer(const RegisterRequest& request) {
  if (absl::Status s = CheckVersion(request); !s.ok()) return s;
  if (request.data_address().empty()) return absl::InvalidArgumentError("server registered without a data address");
  absl::MutexLock lock(&mu_);
  std::optional<uint32_t> index;
  for (auto& [i, node] : servers_) {
    if (node.address == request.data_address()) index = i;
  }
  if (!index) {
    if (servers_.size() >= config_.num_servers()) {
      return absl::ResourceExhaustedError(absl::StrCat("cluster already has its ", config_.num_servers(),
                                                       " servers; refusing ", request.data_address()));
    }
    index = servers_.size();
  }
  Node& node = servers_[*index];
  node = Node{next_node_id_++, SERVER, *index, request.data_address(), request.host(), clock_(), 0};
  ServerInfo* info = nullptr;
  for (auto& s : *map_.mutable_servers()) {
    if (s.index() == *index) info = &s;
  }
  if (info == nullptr) info = map_.add_servers();
  info->set_index(*index);
  info->set_data_address(request.data_address());
  RegisterResponse response;
  response.set_node_id(node.id);
  response.set_server_index(*index);
  *response.mutable_config() = config_;
  return response;
}

absl::StatusOr<RegisterResponse> ClusterState::RegisterWorker(const RegisterRequest& request) {
  if (absl::Status s = CheckVersion(request); !s.ok()) return s;
  if (request.rank() >= config_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", request.rank(), " is outside [0, ",
                                                   config_.num_workers(), ") (config num_workers)"));
  }
  absl::MutexLock lock(&mu_);
  Node& node = workers_[request.rank()];
  node = Node{next_node_id_++, WORKER, request.rank(), "", request.host(), clock_(), 0};
  RegisterResponse response;
  response.set_node_id(node.id);
  *response.mutable_config() = config_;
  return response;
}

bool ClusterState::ClusterComplete() const {
  return servers_.size() == config_.num_servers() && workers_.size() == config_.num_workers();
}

std::string ClusterState::MissingNodes() const {
  std::vector<uint32_t> missing_ranks;
  for (uint32_t r = 0; r < config_.num_workers(); ++r) {
    if (!workers_.contains(r)) missing_ranks.push_back(r);
  }
  std::string out = absl::StrCat("servers registered ", servers_.size(), "/", config_.num_servers(),
                                 ", workers registered ", workers_.size(), "/", config_.num_workers());
  if (!missing_ranks.empty()) absl::StrAppend(&out, "; missing worker ranks: ", absl::StrJoin(missing_ranks, ","));
  return out;
}

absl::Status ClusterState::WaitForCluster(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const absl::Time start = clock_();
  auto complete = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ClusterComplete(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&complete), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("rendezvous: waited ",
                                                    absl::FormatDuration(clock_() - start),
                                                    " for the cluster; ", MissingNodes()));
  }
  return absl::OkStatus();
}

ClusterState::Node* ClusterState::FindNode(uint64_t id) {
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      if (node.id == id) return &node;
    }
  }
  return nullptr;
}

absl::StatusOr<HeartbeatResponse> ClusterState::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_id());
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("node ", request.node_id(), " is not registered (scheduler restarted?)"));
  }
  node->last_seen = clock_();
  node->applied_epoch = request.applied_epoch();
  HeartbeatResponse response;
  response.set_epoch(map_.epoch());
  return response;
}

bool ClusterState::ServersServe(uint64_t epoch) const {
  if (servers_.size() != config_.num_servers()) return false;
  for (const auto& [i, node] : servers_) {
    if (node.applied_epoch < epoch) return false;
  }
  return true;
}

std::string ClusterState::ServersBehind(uint64_t epoch) const {
  std::vector<std::string> behind;
  for (const auto& [i, node] : servers_) {
    if (node.applied_epoch < epoch) behind.push_back(absl::StrCat(i, " (", node.address, ")"));
  }
  return absl::StrCat("servers registered ", servers_.size(), "/", config_.num_servers(),
                      behind.empty() ? "" : "; not yet serving it: server ", absl::StrJoin(behind, ", "));
}

absl::StatusOr<ShardMap> ClusterState::DefineTensors(const std::vector<TensorSpec>& tensors,
                                                     absl::Time deadline) {
  if (absl::Status s = ValidateTensorSpecs(tensors); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto all_servers = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return servers_.size() == config_.num_servers();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&all_servers), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("defining tensors: not all servers registered; ", MissingNodes()));
  }
  if (tensors_.empty()) {
    std::vector<ServerInfo> servers(map_.servers().begin(), map_.servers().end());
    std::sort(servers.begin(), servers.end(), [](auto& a, auto& b) { return a.index() < b.index(); });
    auto map = BuildShardMap(tensors, servers, config_.partition_bytes(), map_.epoch() + 1);
    if (!map.ok()) return map.status();
    map_ = *std::move(map);
    tensors_ = tensors;
  } else {
    if (tensors.size() != tensors_.size()) {
      return absl::FailedPreconditionError(absl::StrCat("tensors differ from those already defined: ",
                                                        tensors.size(), " declared, ", tensors_.size(), " defined"));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!google::protobuf::util::MessageDifferencer::Equals(tensors[i], tensors_[i])) {
        return absl::FailedPreconditionError(absl::StrCat("tensor #", i, " ", DescribeTensor(tensors[i]),
                                                          " differs from the defined ", DescribeTensor(tensors_[i])));
      }
    }
  }
  const uint64_t epoch = map_.epoch();
  auto serving = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ServersServe(epoch); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&serving), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("shard map epoch ", epoch, " not served in time; ",
                                                    ServersBehind(epoch)));
  }
  return map_;
}

std::optional<ShardMap> ClusterState::WaitForMap(uint64_t known_epoch, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto newer = [this, known_epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return map_.epoch() > known_epoch;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&newer), deadline)) return std::nullopt;
  return map_;
}

absl::Status ClusterState::Barrier(uint64_t node_id, const std::string& name, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(node_id);
  if (node == nullptr || node->role != WORKER) {
    return absl::FailedPreconditionError(absl::StrCat("barrier '", name, "': node ", node_id, " is not a registered worker"));
  }
  BarrierState& b = barriers_[name];
  const uint64_t generation = b.generation;
  b.arrived.insert(node->rank);
  if (b.arrived.size() == config_.num_workers()) {
    b.generation++;
    b.arrived.clear();
    return absl::OkStatus();
  }
  const absl::Time start = clock_();
  auto passed = [&b, generation]() { return b.generation > generation; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&passed), deadline)) {
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < config_.num_workers(); ++r) {
      if (!b.arrived.contains(r)) missing.push_back(r);
    }
    b.arrived.erase(node->rank);
    return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "': waited ",
                                                    absl::FormatDuration(clock_() - start),
                                                    "; missing worker ranks: ", absl::StrJoin(missing, ",")));
  }
  return absl::OkStatus();
}

StatusResponse ClusterState::Status() {
  absl::MutexLock lock(&mu_);
  StatusResponse response;
  *response.mutable_config() = config_;
  *response.mutable_shard_map() = map_;
  const absl::Time now = clock_();
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      NodeStatus* s = response.add_nodes();
      s->set_node_id(node.id);
      s->set_role(node.role);
      s->set_rank(node.rank);
      s->set_address(node.address);
      s->set_host(node.host);
      const int64_t ms = absl::ToInt64Milliseconds(now - node.last_seen);
      s->set_ms_since_heartbeat(ms);
      s->set_alive(ms <= static_cast<int64_t>(config_.heartbeat_timeout_ms()));
      s->set_applied_epoch(node.applied_epoch);
    }
  }
  return response;
}

}  // namespace shardps
