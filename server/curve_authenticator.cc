#include "server/curve_authenticator.h"

#include <zmq.h>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/data_message.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<CurveAuthenticator>> CurveAuthenticator::Create(zmq::context_t& context,
                                                                               std::string name) {
  auto made = MakeSocket(context, zmq::socket_type::rep, absl::StrCat(name, ": CURVE authenticator"));
  if (!made.ok()) return made.status();
  zmq::socket_t socket = *std::move(made);
  socket.set(zmq::sockopt::linger, 0);
  try {
    socket.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat(name, ": cannot start the CURVE authenticator: ", e.what()));
  }
  return std::unique_ptr<CurveAuthenticator>(new CurveAuthenticator(std::move(socket), std::move(name)));
}

CurveAuthenticator::CurveAuthenticator(zmq::socket_t socket, std::string name)
    : socket_(std::move(socket)), name_(std::move(name)) {
  thread_ = std::thread([this] { Loop(); });
}

CurveAuthenticator::~CurveAuthenticator() {
  stop_.store(true);
  thread_.join();
}

void CurveAuthenticator::Allow(const std::vector<std::string>& z85_keys) {
  absl::flat_hash_set<std::string> allowed;
  for (const std::string& key : z85_keys) {
    uint8_t binary[32];
    if (key.size() == 40 && zmq_z85_decode(binary, key.c_str()) != nullptr) {
      allowed.insert(std::string(reinterpret_cast<char*>(binary), sizeof(binary)));
    }
  }
  absl::MutexLock lock(&mu_);
  allowed_ = std::move(allowed);
  listed_ = true;
}

void CurveAuthenticator::Loop() {
  zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
  while (!stop_.load()) {
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> request;
      do {
        request.emplace_back();
        (void)socket_.recv(request.back());
      } while (request.back().more());
      Answer(request);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) LOG(ERROR) << name_ << ": CURVE authenticator: " << e.what();
    }
  }
  socket_.close();
}

void CurveAuthenticator::Answer(std::vector<zmq::message_t>& request) {
  // version, request id, domain, address, identity, mechanism, credentials...
  std::string status = "400", text = "malformed ZAP request", user_id;
  if (request.size() >= 7 && request[5].to_string() == "CURVE" && request[6].size() == 32) {
    bool known;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&listed_), kFirstListWait);
      known = allowed_.contains(request[6].to_string());
    }
    status = known ? "200" : "400";
    text = known ? "OK" : "unknown client key";
    char z85[41];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
    if (known) {
      // The connection's messages carry the key as their "User-Id"
      // property, so the server can tell which node sent each (SenderRoles).
      user_id = z85;
    } else {
      LOG_EVERY_N(WARNING, 100) << name_ << ": refused a data client from " << request[3].to_string()
                                << " with an unregistered CURVE key " << z85;
    }
  }
  const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
  socket_.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(status), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(user_id), zmq::send_flags::sndmore);
  socket_.send(zmq::str_buffer(""), zmq::send_flags::none);  // metadata
}

}  // namespace shardps
