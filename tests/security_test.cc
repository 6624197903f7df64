// Both planes secured, end to end: a scheduler in this process (so its log
// lines can be read) with TLS, mutual TLS and a token, real server processes
// with sealed (AES-256-GCM) or CURVE data sockets, and clients with and
// without the credentials.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <thread>

#include <glog/logging.h>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/data_message.h"
#include "common/peer_seal.h"
#include "common/protocol.h"
#include "common/scheduler_client.h"
#include "common/tensor_spec.h"
#include "common/warning_lines_test_util.h"
#include "scheduler/scheduler.h"
#include "tests/test_training.h"
#include "tools/cluster_credentials.h"
#include "tools/process.h"
#include "worker/c_api.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("shardps-security-test-", getpid());
    auto files = WriteClusterCredentials(dir_ + "/cluster", {}, /*mutual=*/true);
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
    auto scheduler_security = LoadSecurityCredentialsFile(files_.scheduler_config, true);
    ASSERT_TRUE(scheduler_security.ok()) << scheduler_security.status();
    auto node_security = LoadSecurityCredentialsFile(files_.node_config, false);
    ASSERT_TRUE(node_security.ok()) << node_security.status();
    node_ = *node_security;
    SchedulerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.config.set_num_servers(1);
    options.config.set_num_workers(2);  // rank 1: a raw client that registers a key
    options.config.set_consistency(ASYNC);
    options.security = *scheduler_security;
    auto scheduler = SchedulerDaemon::Create(options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  void TearDown() override {
    if (server_.running()) Stop(server_, absl::Seconds(5));
    if (HasFailure()) std::cerr << "server log:\n" << ServerLog();
    scheduler_.reset();
    std::filesystem::remove_all(dir_);
  }

  // What the server process (StartJob) logged so far.
  std::string ServerLog() {
    std::ifstream in(dir_ + "/server.log");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // The server's log once it holds `text` (or after 5 s).
  std::string ServerLogOnceItSays(const std::string& text) {
    std::string log = ServerLog();
    for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
         log.find(text) == std::string::npos && absl::Now() < deadline; log = ServerLog()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return log;
  }

  // Registers a worker with `security`; its error, or OK.
  absl::Status RegisterWith(const SecurityCredentials& security) {
    auto client = SchedulerClient::Create(scheduler_->address(), security);
    if (!client.ok()) return client.status();
    RegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_role(WORKER);
    request.set_rank(0);
    return (*client)->Register(request, absl::Seconds(2)).status();
  }

  // wrong_ca_config_: the node's config with the CA of another cluster
  // (wrong_ca_file_), which did not sign the scheduler's certificate.
  void WriteNodeConfigWithAnotherCa() {
    ASSERT_TRUE(WriteClusterCredentials(dir_ + "/other", {}, /*mutual=*/true).ok());
    std::ifstream in(files_.node_config);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string ca = dir_ + "/cluster/ca.pem";
    wrong_ca_file_ = dir_ + "/other/ca.pem";
    ASSERT_THAT(text, HasSubstr(ca));
    text = absl::StrReplaceAll(text, {{ca, wrong_ca_file_}});
    wrong_ca_config_ = dir_ + "/wrong-ca.conf";
    std::ofstream(wrong_ca_config_) << text;
  }

  // A secured server process (its data socket protected by `cipher`), a
  // worker (rank 0) with the node's credentials, a raw client registered as
  // rank 1 with the key pair `registered_`, and a tensor of kN sevens.
  void StartJob(DataCipher cipher = AES_256_GCM) {
    std::string server_config = files_.node_config;
    if (cipher != AES_256_GCM) {
      server_config = dir_ + "/server.conf";
      std::filesystem::copy_file(files_.node_config, server_config);
      ASSERT_TRUE(SetDataCipher(server_config, cipher).ok());
    }
    auto keys = NewCurveKeyPair();
    ASSERT_TRUE(keys.ok());
    registered_ = *keys;
    auto client = SchedulerClient::Create(scheduler_->address(), node_);
    ASSERT_TRUE(client.ok());
    std::thread rank1([&] {
      RegisterRequest request;
      request.set_protocol_version(kProtocolVersion);
      request.set_role(WORKER);
      request.set_rank(1);
      request.set_curve_public_key(registered_.public_key);
      EXPECT_TRUE((*client)->Register(request, absl::Seconds(30)).ok());
    });
    // Its log in a file, for tests that read what it says (TearDown shows
    // it when a test failed).
    const int log = open((dir_ + "/server.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(log, 0);
    SpawnOptions spawn;
    spawn.stdout_fd = spawn.stderr_fd = log;
    auto server = Spawn("server", {SHARDPS_BINARY, "server", "--scheduler", scheduler_->address(), "--listen",
                                   "tcp://127.0.0.1:0", "--security-config", server_config}, spawn);
    close(log);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    auto worker = Worker::Create({.scheduler_address = scheduler_->address(), .rank = 0, .security = node_});
    rank1.join();
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    ASSERT_TRUE(worker_->DefineTensors({Float32Tensor("w", kN)}).ok());
    ASSERT_TRUE(worker_->InitTensor("w", std::vector<float>(kN, 7.0f), absl::Seconds(10)).ok());
    const StatusResponse status = scheduler_->Status();
    const ServerInfo& info = status.shard_map().servers(0);
    server_address_ = info.data_address();
    server_key_ = info.curve_public_key();
    server_sealed_ = info.sealed_data();
  }

  // A valid PUSH of ones as worker `rank` (by default the raw client's):
  // header, payload.
  std::pair<DataHeader, std::vector<float>> ForgedPush(uint32_t rank = 1) {
    DataHeader h;
    h.set_protocol_version(kProtocolVersion);
    h.set_op(PUSH);
    h.set_worker_rank(rank);
    h.set_epoch(1);
    h.set_partition_id(0);
    h.set_request_id(1000 + next_id_++);
    h.set_dtype(FLOAT32);
    h.set_num_elements(kN);
    return {h, std::vector<float>(kN, 1.0f)};
  }

  // Sends `frames` from a fresh DEALER set up by `secure` (none: plain); the
  // first frame of the answer if one came within 2 s.
  std::optional<zmq::message_t> Exchange(const std::vector<std::string>& frames,
                                         const std::function<void(zmq::socket_t&)>& secure) {
    zmq::socket_t socket(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::rcvtimeo, 2000);
    socket.set(zmq::sockopt::linger, 0);
    if (secure) secure(socket);
    socket.connect(server_address_);
    for (size_t i = 0; i < frames.size(); ++i) {
      socket.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::message_t answer;
    if (!socket.recv(answer).has_value()) return std::nullopt;
    return answer;
  }

  bool Answered(const std::vector<std::string>& frames, const std::function<void(zmq::socket_t&)>& secure = {}) {
    return Exchange(frames, secure).has_value();
  }

  // The header of the answer to `frames` (as Exchange), opened with `seal`
  // when the server seals; nothing if no answer came.
  std::optional<DataHeader> AnswerTo(const std::vector<std::string>& frames,
                                     const std::function<void(zmq::socket_t&)>& secure, PeerSeal* seal = nullptr) {
    std::optional<zmq::message_t> answer = Exchange(frames, secure);
    if (!answer) return std::nullopt;
    DataHeader h;
    if (seal != nullptr) {
      EXPECT_TRUE(OpenMessage(*seal, *answer, nullptr, &h).ok());
    } else {
      EXPECT_TRUE(h.ParseFromArray(answer->data(), answer->size()));
    }
    return h;
  }

  // `h` and a payload of kN ones sealed with `seal`: envelope, payload.
  static std::vector<std::string> Sealed(PeerSeal& seal, DataHeader h) {
    const std::vector<float> ones(kN, 1.0f);
    zmq::message_t envelope, payload;
    EXPECT_TRUE(SealMessage(seal, h, true, ones.data(), kN * sizeof(float), &envelope, &payload).ok());
    return {envelope.to_string(), payload.to_string()};
  }

  // A replica update of partition 0 (a round's sum of kN ones) naming
  // server 0 as its primary.
  static DataHeader ForgedReplica() {
    DataHeader h;
    h.set_protocol_version(kProtocolVersion);
    h.set_op(REPLICATE);
    h.set_replica_of(PUSH);
    h.set_replica_from(0);
    h.set_request_id(1);
    h.set_epoch(1);
    h.set_partition_id(0);
    h.set_dtype(FLOAT32);
    h.set_num_elements(kN);
    return h;
  }

  // The forged PUSH in the clear, from a DEALER set up by `secure`.
  bool ForgedPushAnswered(const std::function<void(zmq::socket_t&)>& secure) {
    auto [h, ones] = ForgedPush();
    return Answered({h.SerializeAsString(), std::string(reinterpret_cast<const char*>(ones.data()), kN * 4)}, secure);
  }

  // The forged PUSH sealed with `seal`: envelope, payload.
  std::vector<std::string> SealedPush(PeerSeal& seal) { return Sealed(seal, ForgedPush().first); }

  std::vector<float> Weights() { return PullWeights(*worker_, "w", kN); }

  // The server's requests_refused as its heartbeats report it, once it
  // reaches `at_least` (or after 10 s).
  uint64_t RefusedReaches(uint64_t at_least) {
    uint64_t refused = 0;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(50))) {
      const StatusResponse status = scheduler_->Status();
      for (const NodeStatus& n : status.nodes()) {
        if (n.role() == SERVER) refused = n.counters().requests_refused();
      }
      if (refused >= at_least) break;
    }
    return refused;
  }

  static constexpr int kN = 64;
  std::string dir_;
  ClusterCredentialFiles files_;
  SecurityCredentials node_;
  std::unique_ptr<SchedulerDaemon> scheduler_;
  ChildProcess server_;
  std::unique_ptr<Worker> worker_;
  std::string server_address_, server_key_;
  std::string wrong_ca_file_, wrong_ca_config_;
  bool server_sealed_ = false;
  CurveKeyPair registered_;
  zmq::context_t context_{1};
  int next_id_ = 0;
};

TEST_F(SecurityTest, NodeWithoutTheTokenIsRefusedWithALogLineNamingIt) {
  WarningLines log;
  SecurityCredentials wrong = node_;
  wrong.token = "not-the-cluster-token-at-all";
  absl::Status s = RegisterWith(wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("wrong cluster token"));
  EXPECT_THAT(log.Joined(), HasSubstr("peer certificate CN shardps-node"));
  EXPECT_THAT(log.Joined(), HasSubstr("refused: the call carries a wrong cluster token"));
  auto client = SchedulerClient::Create(scheduler_->address(), node_);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Status(absl::Seconds(5)).ok()) << "the right credentials must pass";
}

// A node holding the credentials is trusted with ranks and tensors, not
// with the scheduler's logs and status: a 1 MB host was kept and shown in
// every Status answer, and a refusal echoing it exceeded the client's
// metadata limit, hiding the reason; the log named the host the caller
// claimed, not the peer (an empty host named nobody).
TEST_F(SecurityTest, ARegistrationWithAMegabyteFieldIsRefusedNamingItAndLoggedWithThePeer) {
  WarningLines log;
  auto client = SchedulerClient::Create(scheduler_->address(), node_);
  ASSERT_TRUE(client.ok());
  RegisterRequest worker;
  worker.set_protocol_version(kProtocolVersion);
  worker.set_role(WORKER);
  worker.set_host(std::string(1 << 20, 'h'));
  absl::Status s = (*client)->Register(worker, absl::Seconds(5)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.ToString().substr(0, 300);
  EXPECT_THAT(s.message(), HasSubstr("is 1048576 bytes long; at most 4096"));
  RegisterRequest server = worker;
  server.set_role(SERVER);
  server.set_host("h");
  server.set_data_address(absl::StrCat("tcp://", std::string(1 << 20, 'a'), ":7001"));
  s = (*client)->Register(server, absl::Seconds(5)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.ToString().substr(0, 300);
  EXPECT_THAT(s.message(), HasSubstr("server data address"));
  worker.set_host("");
  worker.set_rank(uint32_t{1} << 31);
  s = (*client)->Register(worker, absl::Seconds(5)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::string lines = log.Joined();
  EXPECT_THAT(lines, HasSubstr("worker rank 2147483648 is outside [0, 2)"));
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2) << lines.substr(0, 1000);
  EXPECT_LT(lines.size(), 3000u) << "megabytes of a caller's field in the log";
  for (absl::string_view line : absl::StrSplit(lines, '\n')) {
    EXPECT_THAT(line, HasSubstr("peer ipv4:127.0.0.1:")) << line.substr(0, 300);
  }
  auto status = (*client)->Status(absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_LT(status->ByteSizeLong(), 10000u);
}

// Anyone who reaches the scheduler's port can open connections and send
// nothing: gRPC held each for 120 s, about 27 KB of the scheduler's memory
// apiece (3,000 of them: 28 MB to 108 MB RSS).
TEST_F(SecurityTest, AConnectionThatSendsNothingIsClosedAtTheHandshakeTimeout) {
  auto security = LoadSecurityCredentialsFile(files_.scheduler_config, true);
  ASSERT_TRUE(security.ok()) << security.status();
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.config.set_num_servers(1);
  options.config.set_num_workers(1);
  options.security = *security;
  options.handshake_timeout = absl::Seconds(1);
  auto scheduler = SchedulerDaemon::Create(options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  const std::string address = (*scheduler)->address();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::stoi(address.substr(address.rfind(':') + 1)));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  std::vector<pollfd> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0) << strerror(errno);
    idle.push_back(pollfd{.fd = fd, .events = POLLIN, .revents = 0});
  }
  // Closed by the scheduler: readable, and the read finds the end (or a reset).
  const absl::Time start = absl::Now();
  int closed = 0;
  while (closed < 20 && absl::Now() - start < absl::Seconds(5)) {
    if (poll(idle.data(), idle.size(), 100) <= 0) continue;
    for (pollfd& p : idle) {
      char byte;
      if (p.fd < 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0 || read(p.fd, &byte, 1) > 0) continue;
      close(p.fd);
      p.fd = -1;  // poll skips it
      ++closed;
    }
  }
  for (const pollfd& p : idle) {
    if (p.fd >= 0) close(p.fd);
  }
  EXPECT_EQ(closed, 20) << "connections that sent nothing still open after " << absl::Now() - start;
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  auto client = SchedulerClient::Create(address, node_);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Status(absl::Seconds(5)).ok()) << "a node's call after them";
}

// Each connection that fails the TLS handshake (here plain HTTP) made gRPC
// write an ERROR line to stderr, whatever the rate: anyone who reaches the
// port wrote the scheduler's log as fast as it opened connections.
TEST_F(SecurityTest, FailedTlsHandshakesAreLoggedAtARateLimit) {
  class HandshakeLines : public google::LogSink {
   public:
    HandshakeLines() { google::AddLogSink(this); }
    ~HandshakeLines() override { google::RemoveLogSink(this); }
    void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&, const char* message,
              size_t length) override {
      if (absl::string_view(message, length).find("Handshake failed") != absl::string_view::npos) ++count;
    }
    std::atomic<int> count{0};
  } lines;
  const std::string address = scheduler_->address();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::stoi(address.substr(address.rfind(':') + 1)));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  // 1000: at least one is logged whatever earlier tests of this process failed.
  for (int i = 0; i < 1000; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0) << strerror(errno);
    const std::string http = "GET / HTTP/1.0\r\n\r\n";
    (void)write(fd, http.data(), http.size());
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }
  EXPECT_GE(lines.count.load(), 1) << "failed handshakes are not logged through glog";
  EXPECT_LE(lines.count.load(), 22) << "every failed handshake logged";
}

// A drain or checkpoint request the scheduler refuses was said to the
// caller only: the scheduler's log held no trace of who asked for what.
TEST_F(SecurityTest, ARefusedDrainOrCheckpointIsLoggedWithThePeer) {
  WarningLines log;
  auto client = SchedulerClient::Create(scheduler_->address(), node_);
  ASSERT_TRUE(client.ok());
  DrainRequest drain;
  drain.set_server(99);
  EXPECT_EQ((*client)->Drain(drain, absl::Seconds(5)).status().code(), absl::StatusCode::kNotFound);
  CheckpointRequest checkpoint;
  checkpoint.set_dir(dir_ + "/checkpoints");
  EXPECT_FALSE((*client)->RequestCheckpoint(checkpoint, absl::Seconds(5)).ok());
  const std::string lines = log.Joined();
  EXPECT_THAT(lines, HasSubstr("drain of server 99 refused (peer ipv4:127.0.0.1:"));
  EXPECT_THAT(lines, HasSubstr("there is no server 99 in the cluster"));
  EXPECT_THAT(lines, HasSubstr(absl::StrCat("checkpoint into ", dir_, "/checkpoints refused (peer ipv4:127.0.0.1:")));
  EXPECT_THAT(lines, HasSubstr("no tensors are defined yet"));
}

TEST_F(SecurityTest, WhileTheTokenIsRotatedTheSchedulerAcceptsTheNewOneAndStillNoOther) {
  // Step 1 of a rotation (deploy/README.md): the scheduler restarted with
  // the new token accepted beside the old one, here from a file.
  const std::string new_token_file = dir_ + "/new-token";
  std::ofstream(new_token_file) << "the-next-cluster-token-0123456789\n";
  std::ifstream in(files_.scheduler_config);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string rotating = dir_ + "/rotating.conf";
  std::ofstream(rotating) << absl::StrReplaceAll(
      text, {{"security {", absl::StrCat("security {\n  accepted_token_files: \"", new_token_file, "\"")}});
  auto security = LoadSecurityCredentialsFile(rotating, true);
  ASSERT_TRUE(security.ok()) << security.status();
  ASSERT_EQ(security->accepted_tokens.size(), 1u);
  scheduler_.reset();
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.config.set_num_servers(1);
  options.config.set_num_workers(2);
  options.security = *security;
  WarningLines log;
  auto scheduler = SchedulerDaemon::Create(options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  scheduler_ = *std::move(scheduler);
  EXPECT_THAT(log.Joined(), HasSubstr("accepting 2 cluster tokens"));
  SecurityCredentials next = node_;
  next.token = "the-next-cluster-token-0123456789";
  auto status_with = [&](const SecurityCredentials& c) {
    auto client = SchedulerClient::Create(scheduler_->address(), c);
    return client.ok() ? (*client)->Status(absl::Seconds(5)).status() : client.status();
  };
  EXPECT_TRUE(status_with(next).ok()) << "a node already given the new token";
  EXPECT_TRUE(status_with(node_).ok()) << "a node still on the old one";
  SecurityCredentials wrong = node_;
  wrong.token = "not-the-cluster-token-at-all";
  EXPECT_THAT(status_with(wrong).message(), HasSubstr("wrong cluster token"));
  // A short accepted token is refused by the scheduler as a short token is.
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token("a-long-enough-cluster-token");
  config.add_accepted_tokens("short");
  EXPECT_THAT(LoadSecurityCredentials(config, /*for_scheduler=*/true).status().message(),
              HasSubstr("accepted token 1 has 5 characters"));
}

TEST_F(SecurityTest, CallWithoutTokenIsRefused) {
  WarningLines log;
  SecurityCredentials no_token = node_;
  no_token.token.clear();  // TLS and the right certificate, but no token sent
  absl::Status s = RegisterWith(no_token);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(log.Joined(), HasSubstr("refused: the call carries no cluster token"));
}

TEST_F(SecurityTest, PlainClientCannotTalkToASecuredScheduler) {
  absl::Status s = RegisterWith(SecurityCredentials());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(scheduler_->address()));
  EXPECT_THAT(s.message(), HasSubstr("a secured scheduler needs --security-config"));
}

// A port bound but not listening refuses connections, as a scheduler's would
// before it starts or at a mistyped port.
TEST_F(SecurityTest, NodeThatFindsNothingListeningIsToldSoNotToCheckItsCertificates) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  for (const SecurityCredentials& security : {node_, SecurityCredentials()}) {
    auto client = SchedulerClient::Create(address, security);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::Status s = (*client)->Status(absl::Seconds(2)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr(address));
    EXPECT_THAT(s.message(), HasSubstr("connection refused: nothing listens there"));
    EXPECT_THAT(s.message(), Not(HasSubstr("certificate")));
    EXPECT_THAT(s.message(), Not(HasSubstr("--security-config")));
  }
  close(fd);
}

TEST_F(SecurityTest, NodeGivenASchedulerNameThatDoesNotResolveIsToldSoNotToCheckItsCertificates) {
  for (const SecurityCredentials& security : {node_, SecurityCredentials()}) {
    auto client = SchedulerClient::Create("scheduler.invalid:7000", security);  // .invalid never resolves
    ASSERT_TRUE(client.ok()) << client.status();
    absl::Status s = (*client)->Status(absl::Seconds(2)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("host name does not resolve on this host"));
    EXPECT_THAT(s.message(), Not(HasSubstr("certificate")));
    EXPECT_THAT(s.message(), Not(HasSubstr("--security-config")));
  }
}

TEST_F(SecurityTest, NodePointedAtAServersDataPortIsToldItIsNoGrpcService) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  const std::string address = endpoint.substr(endpoint.find("//") + 2);
  auto client = SchedulerClient::Create(address, SecurityCredentials());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->Status(absl::Seconds(2)).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no gRPC service: a server's data port"));
  EXPECT_THAT(s.message(), Not(HasSubstr("--security-config")));
}

TEST_F(SecurityTest, NodeCertificateOfAnotherCaIsRefusedWithALogLine) {
  auto other = WriteClusterCredentials(dir_ + "/other", {}, /*mutual=*/true);
  ASSERT_TRUE(other.ok()) << other.status();
  auto other_node = LoadSecurityCredentialsFile(other->node_config, false);
  ASSERT_TRUE(other_node.ok());
  SecurityCredentials forged = node_;  // the right token and CA
  forged.cert_pem = other_node->cert_pem;
  forged.key_pem = other_node->key_pem;
  WarningLines log;
  absl::Status s = RegisterWith(forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(log.Joined(), HasSubstr("peer certificate CN shardps-node"));
  EXPECT_THAT(log.Joined(), HasSubstr("refused: its certificate is not one of the cluster CA"));
}

// Refused in the TLS handshake, it was logged only by gRPC, as one more
// failed handshake, and the node, taking the failure for a scheduler not up
// yet, waited out its registration deadline to report a failed connection.
TEST_F(SecurityTest, NodeWithoutACertificateIsRefusedUnderMutualTlsAtOnceWithALogLineNamingIt) {
  SecurityCredentials no_cert = node_;
  no_cert.cert_pem.clear();
  no_cert.key_pem.clear();
  WarningLines log;
  const absl::Time start = absl::Now();
  absl::Status s = RegisterWith(no_cert);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("it showed no client certificate"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << s;
  // gRPC 1.51's auth context holds no peer address: the line says what it can.
  EXPECT_THAT(log.Joined(), HasSubstr("peer (no certificate, address unknown) refused: it showed no client certificate"));
}

// A CA that did not sign the scheduler's certificate fails every handshake
// alike: a node that waited out its registration deadline (30 s) for it
// would only report the error later. A real server process exits within
// seconds, naming the CA file, the certificate and the scheduler.
TEST_F(SecurityTest, ServerGivenAnotherCaExitsAtOnceNamingTheCaFileAndTheScheduler) {
  ASSERT_NO_FATAL_FAILURE(WriteNodeConfigWithAnotherCa());
  const std::string log = dir_ + "/server.log";
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  SpawnOptions options;
  options.stdout_fd = options.stderr_fd = fd;
  auto server = Spawn("server", {SHARDPS_BINARY, "server", "--scheduler", scheduler_->address(), "--listen",
                                 "tcp://127.0.0.1:0", "--security-config", wrong_ca_config_}, options);
  close(fd);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *server;
  std::vector<ChildProcess> children = {server_};
  int exit_code = 0;
  auto exited = WaitAny(children, absl::Now() + absl::Seconds(10), &exit_code);
  ASSERT_TRUE(exited.ok()) << "a server with another CA still waits after 10 s: " << exited.status();
  server_ = {};
  EXPECT_NE(exit_code, 0);
  std::ifstream in(log);
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(err, HasSubstr(absl::StrCat("scheduler ", scheduler_->address())));
  EXPECT_THAT(err, HasSubstr(absl::StrCat("certificate verification against CA file ", wrong_ca_file_, " failed")));
}

TEST_F(SecurityTest, CApiWorkerGivenAnotherCaFailsAtOnceNamingTheCaFileAndTheScheduler) {
  ASSERT_NO_FATAL_FAILURE(WriteNodeConfigWithAnotherCa());
  char err[1024] = "";
  shardps_worker* w = nullptr;
  const absl::Time start = absl::Now();
  EXPECT_NE(shardps_worker_create_secure(scheduler_->address().c_str(), 0, 30.0, wrong_ca_config_.c_str(), &w, err,
                                         sizeof(err)),
            0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "waited for a handshake that cannot pass: " << err;
  EXPECT_EQ(w, nullptr);
  EXPECT_THAT(std::string(err), HasSubstr(absl::StrCat("scheduler ", scheduler_->address())));
  EXPECT_THAT(std::string(err),
              HasSubstr(absl::StrCat("certificate verification against CA file ", wrong_ca_file_, " failed")));
}

// A valid certificate of another host fails every handshake alike too.
TEST_F(SecurityTest, NodeExpectingAnotherSchedulerNameFailsAtOnceSayingTheCertificateDoesNotNameIt) {
  SecurityCredentials elsewhere = node_;
  elsewhere.server_name = "scheduler.other.example";
  auto client = SchedulerClient::Create(scheduler_->address(), elsewhere);
  ASSERT_TRUE(client.ok()) << client.status();
  RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(WORKER);
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->Register(request, absl::Seconds(30)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "waited for a handshake that cannot pass: " << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("scheduler ", scheduler_->address())));
  EXPECT_THAT(s.message(), HasSubstr("the scheduler's certificate does not name the host this node expects"));
  EXPECT_THAT(s.message(), HasSubstr("scheduler.other.example"));
}

TEST_F(SecurityTest, SealedServerAnswersOnlyMessagesItsNodesSealedOnceAndChangesNoWeightOtherwise) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_EQ(server_key_.size(), 40u) << "the server published no key";
  ASSERT_TRUE(server_sealed_) << "a secured server seals by default";
  EXPECT_FALSE(ForgedPushAnswered({})) << "a plain client got an answer";
  // Logged with where it came from: the envelope's key says nothing of that.
  EXPECT_THAT(ServerLogOnceItSays("dropped a data message"),
              HasSubstr("dropped a data message from 127.0.0.1 that is not sealed by a node of the cluster"));
  auto stranger_keys = NewCurveKeyPair();
  ASSERT_TRUE(stranger_keys.ok());
  auto stranger = PeerSeal::Create(*stranger_keys, server_key_, SealEnd::kConnecting);
  ASSERT_TRUE(stranger.ok());
  EXPECT_FALSE(Answered(SealedPush(**stranger))) << "a client with an unregistered key got an answer";
  auto registered = PeerSeal::Create(registered_, server_key_, SealEnd::kConnecting);
  ASSERT_TRUE(registered.ok());
  std::vector<std::string> tampered = SealedPush(**registered);
  tampered[1][5] ^= 1;
  EXPECT_FALSE(Answered(tampered)) << "a tampered payload got an answer";
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
  // The registered key's sealed push is answered and applied: the refusals
  // above came from the keys and the seal, not from the message.
  const std::vector<std::string> genuine = SealedPush(**registered);
  EXPECT_TRUE(Answered(genuine));
  const std::vector<float> after = Weights();
  EXPECT_NE(after, std::vector<float>(kN, 7.0f));
  // The same bytes again, on a new connection: a replay, refused.
  EXPECT_FALSE(Answered(genuine)) << "a replayed message got an answer";
  EXPECT_EQ(Weights(), after);
}

TEST_F(SecurityTest, AMessageSealedByAKeyTheServersMapListsOnlyLaterIsAnsweredOnceItDoes) {
  // As a primary's first snapshot to a server that just joined, sent before
  // that server's own map (with the primary's key) reached it: dropped, it
  // was never sent again and the copy never completed.
  ASSERT_NO_FATAL_FAILURE(StartJob());
  auto newer = NewCurveKeyPair();
  ASSERT_TRUE(newer.ok());
  auto seal = PeerSeal::Create(*newer, server_key_, SealEnd::kConnecting);
  ASSERT_TRUE(seal.ok());
  zmq::socket_t socket(context_, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::rcvtimeo, 300);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(server_address_);
  const std::vector<std::string> frames = Sealed(**seal, ForgedPush(0).first);
  socket.send(zmq::buffer(frames[0]), zmq::send_flags::sndmore);
  socket.send(zmq::buffer(frames[1]), zmq::send_flags::none);
  zmq::message_t answer;
  EXPECT_FALSE(socket.recv(answer).has_value()) << "answered before the map listed the key";
  // Rank 0's process leaves and a new one with that key takes the rank.
  worker_.reset();
  auto client = SchedulerClient::Create(scheduler_->address(), node_);
  ASSERT_TRUE(client.ok());
  RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(WORKER);
  request.set_rank(0);
  request.set_curve_public_key(newer->public_key);
  auto registered = (*client)->Register(request, absl::Seconds(30));
  ASSERT_TRUE(registered.ok()) << registered.status();
  socket.set(zmq::sockopt::rcvtimeo, 10000);
  ASSERT_TRUE(socket.recv(answer).has_value()) << "the held message was dropped";
  DataHeader h;
  ASSERT_TRUE(OpenMessage(**seal, answer, nullptr, &h).ok());
  EXPECT_EQ(h.request_id(), ForgedPush(0).first.request_id() - 1) << h.ShortDebugString();
}

TEST_F(SecurityTest, ClientWithoutTheCurveKeyGetsNoAnswerAndChangesNoWeight) {
  ASSERT_NO_FATAL_FAILURE(StartJob(CURVE));
  ASSERT_EQ(server_key_.size(), 40u) << "the server published no CURVE key";
  ASSERT_FALSE(server_sealed_);
  EXPECT_FALSE(ForgedPushAnswered([](zmq::socket_t&) {})) << "a plain client got an answer";
  auto stranger = NewCurveKeyPair();
  ASSERT_TRUE(stranger.ok());
  EXPECT_FALSE(ForgedPushAnswered([&](zmq::socket_t& s) { ASSERT_TRUE(MakeCurveClient(s, stranger->public_key).ok()); }))
      << "a client with a wrong server key got an answer";
  EXPECT_FALSE(ForgedPushAnswered([&](zmq::socket_t& s) { ASSERT_TRUE(MakeCurveClient(s, server_key_).ok()); }))
      << "a client with the server's key but an unregistered key of its own got an answer";
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
  // The same push from a registered key is answered and applied: the
  // refusals above came from the keys, not from the message.
  EXPECT_TRUE(ForgedPushAnswered([&](zmq::socket_t& s) {
    ASSERT_TRUE(MakeCurveClient(s, server_key_, &registered_).ok());
  }));
  EXPECT_NE(Weights(), std::vector<float>(kN, 7.0f));
}

// A node holding valid credentials speaks only for itself: worker 1's key
// can push as worker 1, but not as worker 0 nor as a primary server sending
// a backup its round (which skips every check a worker's push goes through).
TEST_F(SecurityTest, SealedServerRefusesARegisteredKeySpeakingForAnotherNode) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  auto registered = PeerSeal::Create(registered_, server_key_, SealEnd::kConnecting);
  ASSERT_TRUE(registered.ok());
  std::optional<DataHeader> as_worker0 = AnswerTo(Sealed(**registered, ForgedPush(/*rank=*/0).first), {}, registered->get());
  ASSERT_TRUE(as_worker0.has_value());
  EXPECT_EQ(as_worker0->status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(as_worker0->error(),
            "a request naming worker 0 from worker 1's key: a worker's key speaks for its own rank only");
  std::optional<DataHeader> as_server = AnswerTo(Sealed(**registered, ForgedReplica()), {}, registered->get());
  ASSERT_TRUE(as_server.has_value());
  EXPECT_EQ(as_server->status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(as_server->error(), ::testing::HasSubstr("from worker 1's key: only a partition's primary server sends them"));
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
  EXPECT_EQ(RefusedReaches(2), 2u) << "the refusals are counted where operators look";
  EXPECT_THAT(ServerLogOnceItSays("refused a data message"),
              HasSubstr("refused a data message from 127.0.0.1: PERMISSION_DENIED: a request naming worker 0 from "
                        "worker 1's key"));
  // The same key pushing as its own rank is applied.
  std::optional<DataHeader> as_itself = AnswerTo(SealedPush(**registered), {}, registered->get());
  ASSERT_TRUE(as_itself.has_value());
  EXPECT_EQ(as_itself->status_code(), 0) << as_itself->error();
  EXPECT_NE(Weights(), std::vector<float>(kN, 7.0f));
}

// A message sealed by a node of the map whose header the server cannot
// read (an unknown op, another protocol version) went unanswered, counted
// and logged as "not sealed by a node of the cluster": the sender waited
// out its timeout, and the operator looked for an intruder.
TEST_F(SecurityTest, SealedServerAnswersARegisteredKeysUnreadableHeaderSayingWhy) {
  ASSERT_NO_FATAL_FAILURE(StartJob());
  auto registered = PeerSeal::Create(registered_, server_key_, SealEnd::kConnecting);
  ASSERT_TRUE(registered.ok());
  auto unreadable = [&](DataHeader h) {
    zmq::message_t envelope, payload;
    const std::string header = h.SerializeAsString();
    const std::vector<float> ones(kN, 1.0f);
    EXPECT_TRUE((*registered)->Seal(header, ones.data(), kN * sizeof(float), &envelope, &payload).ok());
    return AnswerTo({envelope.to_string(), payload.to_string()}, {}, registered->get());
  };
  DataHeader op = ForgedPush().first;
  op.set_protocol_version(kProtocolVersion);
  op.set_op(static_cast<Op>(99));
  std::optional<DataHeader> answer = unreadable(op);
  ASSERT_TRUE(answer.has_value()) << "an unknown op from a registered key went unanswered";
  EXPECT_EQ(answer->status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(answer->error(), "unknown op 99");
  DataHeader version = ForgedPush().first;
  version.set_protocol_version(kProtocolVersion + 1000);
  answer = unreadable(version);
  ASSERT_TRUE(answer.has_value()) << "another protocol version from a registered key went unanswered";
  EXPECT_THAT(answer->error(), HasSubstr("is not supported"));
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
}

TEST_F(SecurityTest, CurveServerRefusesARegisteredKeySpeakingForAnotherNode) {
  ASSERT_NO_FATAL_FAILURE(StartJob(CURVE));
  const auto as_rank1 = [&](zmq::socket_t& s) { ASSERT_TRUE(MakeCurveClient(s, server_key_, &registered_).ok()); };
  auto [push, ones] = ForgedPush(/*rank=*/0);
  const std::string payload(reinterpret_cast<const char*>(ones.data()), kN * sizeof(float));
  std::optional<DataHeader> as_worker0 = AnswerTo({push.SerializeAsString(), payload}, as_rank1);
  ASSERT_TRUE(as_worker0.has_value());
  EXPECT_EQ(as_worker0->status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(as_worker0->error(),
            "a request naming worker 0 from worker 1's key: a worker's key speaks for its own rank only");
  std::optional<DataHeader> as_server = AnswerTo({ForgedReplica().SerializeAsString(), payload}, as_rank1);
  ASSERT_TRUE(as_server.has_value());
  EXPECT_THAT(as_server->error(), ::testing::HasSubstr("from worker 1's key: only a partition's primary server sends them"));
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
  EXPECT_TRUE(ForgedPushAnswered(as_rank1));
  EXPECT_NE(Weights(), std::vector<float>(kN, 7.0f));
}

TEST_F(SecurityTest, CApiWorkerPassesAuthenticationOnlyWithItsSecurityConfig) {
  // No server runs: a worker that got in waits out the rendezvous, and the
  // scheduler's answer names who is missing.
  char err[512];
  shardps_worker* w = nullptr;
  EXPECT_NE(shardps_worker_create_secure(scheduler_->address().c_str(), 0, 1.0, files_.node_config.c_str(), &w, err,
                                         sizeof(err)),
            0);
  EXPECT_THAT(std::string(err), HasSubstr("servers registered 0/1"));
  w = nullptr;
  EXPECT_NE(shardps_worker_create_secure(scheduler_->address().c_str(), 0, 1.0, nullptr, &w, err, sizeof(err)), 0);
  EXPECT_THAT(std::string(err), Not(HasSubstr("servers registered")));
  EXPECT_EQ(w, nullptr);
}

// `shardps local` with `extra` flags; the JSON line it prints.
std::string LocalJson(const std::string& extra) {
  const std::string command =
      absl::StrCat(SHARDPS_BINARY, " local --epochs 1 --train-limit 3000 --test-limit 1000 --log-every 0 ",
                   "--deterministic --json ", extra, " 2>/dev/null");
  FILE* out = popen(command.c_str(), "r");
  std::string text;
  char buf[4096];
  while (out != nullptr && fgets(buf, sizeof(buf), out) != nullptr) text = buf;  // keep the last line
  if (out != nullptr) pclose(out);
  return text;
}

std::string JsonField(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": \"?([^,\"}]*)"))) return "";
  return m[1];
}

TEST(SecureLocalTest, SecuredJobTrainsToTheSameWeightsAsPlain) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::string plain = LocalJson("");
  const std::string secure = LocalJson("--secure");
  ASSERT_EQ(JsonField(secure, "secure"), "true") << secure;
  ASSERT_EQ(JsonField(plain, "secure"), "false") << plain;
  EXPECT_GT(std::stod(JsonField(secure, "test_accuracy")), 0.5) << secure;
  EXPECT_EQ(JsonField(secure, "test_accuracy"), JsonField(plain, "test_accuracy"));
  // Deterministic sync with replication: bitwise the same training.
  EXPECT_EQ(JsonField(secure, "weights_sha256"), JsonField(plain, "weights_sha256"));
}

}  // namespace
}  // namespace shardps
