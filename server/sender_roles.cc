#include "server/sender_roles.h"

#include "absl/strings/str_cat.h"
#include "common/peer_seal.h"

namespace shardps {
namespace {

std::string Name(bool server, uint32_t index) { return absl::StrCat(server ? "server " : "worker ", index); }

}  // namespace

void SenderRoles::Update(const ShardMap& map) {
  roles_.clear();
  for (int rank = 0; rank < map.worker_curve_keys_size(); ++rank) {
    if (auto raw = DecodeZ85Key(map.worker_curve_keys(rank)); raw.ok()) {
      roles_[*raw] = Role{false, static_cast<uint32_t>(rank)};
    }
  }
  for (const ServerInfo& s : map.servers()) {
    if (auto raw = DecodeZ85Key(s.curve_public_key()); raw.ok()) roles_[*raw] = Role{true, s.index()};
  }
}

absl::Status SenderRoles::Check(absl::string_view raw_key, const DataHeader& h) const {
  auto it = roles_.find(raw_key);
  if (it == roles_.end()) return absl::PermissionDeniedError("the sender's key belongs to no node of the shard map");
  const Role& role = it->second;
  if (h.op() == REPLICATE) {
    if (!role.server) {
      return absl::PermissionDeniedError(absl::StrCat("a replica update of partition ", h.partition_id(), " from ",
                                                      Name(false, role.index),
                                                      "'s key: only a partition's primary server sends them"));
    }
    if (!h.has_replica_from() || h.replica_from() != role.index) {
      return absl::PermissionDeniedError(absl::StrCat(
          "a replica update of partition ", h.partition_id(), " naming ",
          h.has_replica_from() ? Name(true, h.replica_from()) : std::string("no server"), " from ",
          Name(true, role.index), "'s key: a server's key speaks for that server only"));
    }
    return absl::OkStatus();
  }
  if (role.server) {
    return absl::PermissionDeniedError(absl::StrCat("a worker's request (op ", Op_Name(h.op()),
                                                    ") from ", Name(true, role.index),
                                                    "'s key: servers send only replica updates"));
  }
  if (h.worker_rank() != role.index) {
    return absl::PermissionDeniedError(absl::StrCat("a request naming worker ", h.worker_rank(), " from ",
                                                    Name(false, role.index),
                                                    "'s key: a worker's key speaks for its own rank only"));
  }
  return absl::OkStatus();
}

}  // namespace shardps
