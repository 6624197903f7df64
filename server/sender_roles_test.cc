#include "server/sender_roles.h"

#include <gtest/gtest.h>

#include "common/peer_seal.h"
#include "common/security.h"

namespace shardps {
namespace {

class SenderRolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      worker_[i] = *NewCurveKeyPair();
      server_[i] = *NewCurveKeyPair();
      map_.add_worker_curve_keys(worker_[i].public_key);
      ServerInfo* s = map_.add_servers();
      s->set_index(i);
      s->set_curve_public_key(server_[i].public_key);
    }
    roles_.Update(map_);
  }

  static std::string Raw(const CurveKeyPair& keys) { return *DecodeZ85Key(keys.public_key); }

  static DataHeader Push(uint32_t rank) {
    DataHeader h;
    h.set_op(PUSH_PULL);
    h.set_worker_rank(rank);
    return h;
  }

  static DataHeader Replica(uint32_t from) {
    DataHeader h;
    h.set_op(REPLICATE);
    h.set_partition_id(3);
    h.set_replica_from(from);
    return h;
  }

  CurveKeyPair worker_[2], server_[2];
  ShardMap map_;
  SenderRoles roles_;
};

TEST_F(SenderRolesTest, AWorkersKeySpeaksForItsOwnRankOnly) {
  EXPECT_TRUE(roles_.Check(Raw(worker_[1]), Push(1)).ok());
  const absl::Status other = roles_.Check(Raw(worker_[1]), Push(0));
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.message(), "a request naming worker 0 from worker 1's key: a worker's key speaks for its own rank only");
}

TEST_F(SenderRolesTest, OnlyTheServerAReplicaUpdateNamesSendsIt) {
  EXPECT_TRUE(roles_.Check(Raw(server_[1]), Replica(1)).ok());
  const absl::Status from_worker = roles_.Check(Raw(worker_[0]), Replica(1));
  EXPECT_EQ(from_worker.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(from_worker.message(),
            "a replica update of partition 3 from worker 0's key: only a partition's primary server sends them");
  const absl::Status other_server = roles_.Check(Raw(server_[0]), Replica(1));
  EXPECT_EQ(other_server.message(),
            "a replica update of partition 3 naming server 1 from server 0's key: a server's key speaks for that server only");
  DataHeader unnamed = Replica(0);
  unnamed.clear_replica_from();
  EXPECT_EQ(roles_.Check(Raw(server_[0]), unnamed).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(SenderRolesTest, AServersKeySendsNoWorkerRequest) {
  const absl::Status s = roles_.Check(Raw(server_[0]), Push(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "a worker's request (op PUSH_PULL) from server 0's key: servers send only replica updates");
}

TEST_F(SenderRolesTest, AKeyTheLatestMapDroppedSpeaksForNoOne) {
  // A worker that restarted registers a new key: the old one is gone.
  const CurveKeyPair old = worker_[1];
  worker_[1] = *NewCurveKeyPair();
  map_.set_worker_curve_keys(1, worker_[1].public_key);
  roles_.Update(map_);
  EXPECT_EQ(roles_.Check(Raw(old), Push(1)).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(roles_.Check(Raw(worker_[1]), Push(1)).ok());
}

}  // namespace
}  // namespace shardps
