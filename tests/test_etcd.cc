#include "tests/test_etcd.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "scheduler/etcd_client.h"

namespace shardps {

constexpr char kEtcd[] = "/usr/bin/etcd";

absl::StatusOr<std::unique_ptr<TestEtcd>> TestEtcd::Start(const TestEtcdOptions& options) {
  if (!std::filesystem::exists(kEtcd)) {
    return absl::FailedPreconditionError(absl::StrCat(kEtcd, " is missing: tools/setup.sh installs it (Debian "
                                                      "package etcd-server)"));
  }
  static std::atomic<int> counter{0};
  auto etcd = std::unique_ptr<TestEtcd>(new TestEtcd());
  etcd->dir_ = std::filesystem::temp_directory_path() / absl::StrCat("shardps-etcd-", getpid(), "-", counter++);
  std::filesystem::remove_all(etcd->dir_);
  std::filesystem::create_directories(etcd->dir_);
  auto client_port = FreeLoopbackPort();
  if (!client_port.ok()) return client_port.status();
  absl::StatusOr<int> peer_port;
  do {  // the kernel may hand the same free port out twice
    peer_port = FreeLoopbackPort();
    if (!peer_port.ok()) return peer_port.status();
  } while (*peer_port == *client_port);
  const bool tls = !options.cert_file.empty();
  etcd->endpoint_ = absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", *client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", *peer_port);
  std::vector<std::string> argv = {kEtcd, "--name", "shardps-test", "--data-dir", etcd->dir_ + "/data",
                                   "--listen-client-urls", etcd->endpoint_, "--advertise-client-urls", etcd->endpoint_,
                                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", "shardps-test=" + peer, "--logger", "zap", "--log-level",
                                   "error"};
  if (tls) argv.insert(argv.end(), {"--cert-file", options.cert_file, "--key-file", options.key_file});
  if (!options.client_ca_file.empty()) {
    argv.insert(argv.end(), {"--client-cert-auth", "--trusted-ca-file", options.client_ca_file});
  }
  auto process = Spawn("etcd", argv, true);
  if (!process.ok()) return process.status();
  etcd->process_ = *process;
  // Wait for the port first: a gRPC channel whose first attempts were
  // refused was seen to take ~10 s to try again.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::Status answered;
  std::vector<ChildProcess> watch = {etcd->process_};
  int exit_code = 0;
  while (!(answered = CheckReachable({"127.0.0.1", static_cast<uint16_t>(*client_port)}, absl::Seconds(1), "etcd"))
              .ok() &&
         absl::Now() < deadline) {
    if (WaitAny(watch, absl::Now(), &exit_code).ok()) {
      etcd->process_.pid = -1;
      return absl::UnavailableError(absl::StrCat("etcd (", kEtcd, ") ", DescribeExit(exit_code),
                                                 " before serving on ", etcd->endpoint_, "; its log is above"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  auto client = EtcdClient::Create(etcd->endpoint_, options.client, absl::Seconds(1));
  if (!client.ok()) return client.status();
  do {
    answered = (*client)->Put("/shardps-test/ready", "1");
    if (answered.ok()) return etcd;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return absl::DeadlineExceededError(absl::StrCat("etcd at ", etcd->endpoint_, " did not answer within 20 s: ",
                                                  answered.message()));
}

TestEtcd::~TestEtcd() {
  if (process_.running()) Kill(process_);
  std::filesystem::remove_all(dir_);
}

}  // namespace shardps
