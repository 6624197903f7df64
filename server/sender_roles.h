// Which node of the shard map holds each data-plane key, and what a request
// sealed (or CURVE-authenticated) with that key may say: a worker's key
// speaks for its own rank only, and only a server's key sends replica
// updates, each naming that server. Without it a node holding valid
// credentials could push as another rank or write a backup's copy as if it
// were the partition's primary, past every check a worker's push goes through.
//
// Rebuilt from each shard map a server installs; Check costs one hash lookup.
// Used on the server's engine thread only.
#ifndef SHARDPS_SERVER_SENDER_ROLES_H_
#define SHARDPS_SERVER_SENDER_ROLES_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/cluster.pb.h"
#include "proto/data.pb.h"

namespace shardps {

class SenderRoles {
 public:
  // Replaces the roles with those of `map`'s keys (workers' by rank,
  // servers' by index); malformed or empty keys are skipped.
  void Update(const ShardMap& map);

  // OK if the holder of `raw_key` (32 bytes) may send `h`; otherwise
  // PERMISSION_DENIED naming the key's node and what the request claimed.
  absl::Status Check(absl::string_view raw_key, const DataHeader& h) const;

 private:
  struct Role {
    bool server = false;
    uint32_t index = 0;  // a server's index or a worker's rank
  };
  absl::flat_hash_map<std::string, Role> roles_;  // raw 32-byte keys
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_SENDER_ROLES_H_
