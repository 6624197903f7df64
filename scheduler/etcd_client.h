// A minimal client of etcd's v3 gRPC API (proto/etcd.proto): the keys,
// leases and guarded writes the scheduler's etcd backend needs. gRPC stays
// in etcd_client.cc.
//
// Every call has a deadline (`call_timeout` per endpoint) and errors name the
// endpoint and what was asked. With several endpoints a call that finds one
// unreachable tries the next; the one that last answered is tried first.
// Over TLS (https:// endpoints, scheduler/etcd_tls.h) a failed handshake is
// reported like an unreachable endpoint, naming it and what TLS said.
// Thread-safe.
#ifndef SHARDPS_SCHEDULER_ETCD_CLIENT_H_
#define SHARDPS_SCHEDULER_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/etcd_tls.h"

namespace shardps {

struct EtcdKeyValue {
  std::string value;
  int64_t create_revision = 0;  // distinct for every creation of the key
  int64_t lease = 0;            // 0: none
  int64_t read_revision = 0;    // the store's revision when this was read
};

class EtcdClient {
 public:
  // `endpoints`: "http://HOST:PORT[,...]" or "https://HOST:PORT[,...]"
  // (etcd's client URLs; one scheme for all). https:// needs `tls.ca_file`
  // and checks that etcd's certificate names HOST; http:// refuses `tls`.
  // Reads the TLS files but does not connect yet. Errors name the endpoint
  // or the flag and file.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const std::string& endpoints,
                                                            const EtcdTlsFiles& tls = {},
                                                            absl::Duration call_timeout = absl::Seconds(2));
  ~EtcdClient();

  const std::string& endpoints() const { return endpoints_; }

  // A new lease of `ttl` (etcd rounds up to whole seconds and to its own
  // minimum); returns its id and the TTL granted.
  absl::StatusOr<std::pair<int64_t, absl::Duration>> GrantLease(absl::Duration ttl);
  // Renews `lease`; returns its TTL from now. NotFound once it has expired.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);

  // The key's value; nullopt if it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key);
  // Creates `key` = `value` attached to `lease` unless the key exists, in one
  // transaction. Returns the key as it is afterwards; `*created` says whether
  // this call created it.
  absl::StatusOr<EtcdKeyValue> CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease,
                                              bool* created);
  // Puts `key` = `value` only while `guard_key` still exists with create
  // revision `guard_revision` (the fence of a leader key); FailedPrecondition,
  // naming `guard_key`, when it does not.
  absl::Status PutIfGuarded(const std::string& key, const std::string& value, const std::string& guard_key,
                            int64_t guard_revision);
  // Unconditional put (tests, tools).
  absl::Status Put(const std::string& key, const std::string& value);

  // Waits, over one etcd watch stream on the endpoint that last answered,
  // until `key` is deleted (e.g. its lease expired or was revoked) at a
  // revision >= `from_revision`: true then, and also when etcd compacted
  // `from_revision` away (look again). False once `timeout` has passed or
  // CancelWaits() was called. Errors name the endpoint.
  absl::StatusOr<bool> AwaitDeletion(const std::string& key, int64_t from_revision, absl::Duration timeout);
  // Makes every AwaitDeletion, in progress or to come, return false at once.
  void CancelWaits();

 private:
  class Impl;
  EtcdClient(std::string endpoints, std::unique_ptr<Impl> impl);
  const std::string endpoints_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_ETCD_CLIENT_H_
