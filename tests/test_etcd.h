// A real etcd for tests: /usr/bin/etcd (Debian etcd-server, installed by
// tools/setup.sh) on free loopback ports with a data directory of its own,
// killed and removed when the object goes away.
#ifndef SHARDPS_TESTS_TEST_ETCD_H_
#define SHARDPS_TESTS_TEST_ETCD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/etcd_tls.h"
#include "tests/test_cluster.h"  // FreeLoopbackPort
#include "tools/process.h"

namespace shardps {

struct TestEtcdOptions {
  // Default (empty): plain http://. Set: https:// served with this
  // certificate and key (PEM; it must name 127.0.0.1).
  std::string cert_file{};
  std::string key_file{};
  // Set: --client-cert-auth, trusting client certificates of this CA.
  std::string client_ca_file{};
  // With https://: what Start()'s readiness check connects with.
  EtcdTlsFiles client{};
};

class TestEtcd {
 public:
  // Starts etcd and waits (up to 20 s) until it answers. FailedPrecondition
  // when /usr/bin/etcd is missing, saying how to install it.
  static absl::StatusOr<std::unique_ptr<TestEtcd>> Start(const TestEtcdOptions& options = {});
  ~TestEtcd();

  // "http://127.0.0.1:PORT" (or https://), for --etcd.
  const std::string& endpoint() const { return endpoint_; }

 private:
  TestEtcd() = default;
  std::string dir_, endpoint_;
  ChildProcess process_;
};

}  // namespace shardps

#endif  // SHARDPS_TESTS_TEST_ETCD_H_
