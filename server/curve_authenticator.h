// The ZAP handler of a secured server (ZeroMQ RFC 27): answers the CURVE
// handshakes of its context's server sockets, admitting only clients whose
// public key is on the allow list (the workers' and servers' keys from the
// shard map). A client with another key completes no handshake, so it can
// neither send nor receive.
//
// Owns a thread and its REP socket on inproc://zeromq.zap.01 in the borrowed
// context, which must outlive this object. Thread-safe.
#ifndef SHARDPS_SERVER_CURVE_AUTHENTICATOR_H_
#define SHARDPS_SERVER_CURVE_AUTHENTICATOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardps {

class CurveAuthenticator {
 public:
  static constexpr absl::Duration kFirstListWait = absl::Seconds(10);

  // Binds the ZAP endpoint; call before any CURVE server socket of `context`
  // binds. `name` (e.g. "server 0") starts its log lines.
  static absl::StatusOr<std::unique_ptr<CurveAuthenticator>> Create(zmq::context_t& context, std::string name);
  ~CurveAuthenticator();

  // Replaces the allow list with `z85_keys` (40-character keys; others are
  // skipped). Until the first call, handshakes wait for it (up to
  // kFirstListWait): a server that just joined a running job is reached by
  // workers and peers that got its address in the same shard map as it.
  void Allow(const std::vector<std::string>& z85_keys);

 private:
  CurveAuthenticator(zmq::socket_t socket, std::string name);
  void Loop();
  // One ZAP request: its frames in, its reply sent.
  void Answer(std::vector<zmq::message_t>& request);

  zmq::socket_t socket_;  // the thread's only
  const std::string name_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> allowed_ ABSL_GUARDED_BY(mu_);  // 32-byte binary keys
  bool listed_ ABSL_GUARDED_BY(mu_) = false;  // Allow was called at least once
  std::thread thread_;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_CURVE_AUTHENTICATOR_H_
