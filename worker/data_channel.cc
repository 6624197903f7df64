#include "worker/data_channel.h"

#include <cstring>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_message.h"

namespace shardps {
namespace {

// First frame of an inproc command: the target server, or kStop.
constexpr uint32_t kStop = 0xffffffffu;

}  // namespace

absl::StatusOr<std::unique_ptr<DataChannel>> DataChannel::Create(const std::vector<std::string>& addresses,
                                                                 uint32_t rank) {
  zmq::context_t context(1);
  std::unique_ptr<DataChannel> channel(new DataChannel(std::move(context), addresses, rank));
  for (size_t i = 0; i < addresses.size(); ++i) {
    zmq::socket_t s(channel->context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::sndhwm, 0);
    s.set(zmq::sockopt::rcvhwm, 0);
    s.set(zmq::sockopt::linger, 0);
    try {
      s.connect(addresses[i]);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(absl::StrCat("cannot connect to server ", i, " at '", addresses[i],
                                                     "': ", e.what()));
    }
    channel->servers_.push_back(std::move(s));
  }
  channel->io_thread_ = std::thread([c = channel.get()] { c->Loop(); });
  return channel;
}

DataChannel::DataChannel(zmq::context_t context, std::vector<std::string> addresses, uint32_t rank)
    : context_(std::move(context)), addresses_(std::move(addresses)), rank_(rank) {
  inproc_endpoint_ = absl::StrCat("inproc://shardps-data-", reinterpret_cast<uintptr_t>(this));
  commands_ = zmq::socket_t(context_, zmq::socket_type::pull);
  commands_.set(zmq::sockopt::rcvhwm, 0);
  commands_.bind(inproc_endpoint_);
  absl::MutexLock lock(&submit_mu_);
  submit_ = zmq::socket_t(context_, zmq::socket_type::push);
  submit_.set(zmq::sockopt::sndhwm, 0);
  submit_.connect(inproc_endpoint_);
}

DataChannel::~DataChannel() {
  {
    absl::MutexLock lock(&submit_mu_);
    uint32_t stop = kStop;
    submit_.send(zmq::buffer(&stop, sizeof(stop)), zmq::send_flags::none);
  }
  if (io_thread_.joinable()) io_thread_.join();
  absl::MutexLock lock(&submit_mu_);
  submit_.close();
}

uint64_t DataChannel::Submit(std::vector<Request> requests, std::string what) {
  uint64_t handle;
  std::vector<uint64_t> ids(requests.size());
  {
    absl::MutexLock lock(&mu_);
    handle = next_handle_++;
    HandleState& h = handles_[handle];
    h.what = std::move(what);
    h.remaining = requests.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      ids[i] = next_request_id_++;
      const Request& r = requests[i];
      pending_[ids[i]] = Pending{handle, r.server, r.header.partition_id(), r.header.num_elements(), r.out,
                                 std::move(requests[i].on_answer)};
      h.request_ids.push_back(ids[i]);
    }
  }
  absl::MutexLock lock(&submit_mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.header.set_request_id(ids[i]);
    r.header.set_worker_rank(rank_);
    zmq::message_t head = HeaderFrame(r.header);
    const bool has_payload = r.payload != nullptr || r.encoded.size() > 0;
    submit_.send(zmq::buffer(&r.server, sizeof(r.server)), zmq::send_flags::sndmore);
    submit_.send(head, has_payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (has_payload) {
      zmq::message_t payload = r.encoded.size() > 0
                                   ? std::move(r.encoded)
                                   : BorrowedFrame(r.payload, r.header.num_elements() * sizeof(float));
      bytes_sent_.fetch_add(payload.size(), std::memory_order_relaxed);
      submit_.send(payload, zmq::send_flags::none);
    }
  }
  requests_sent_.fetch_add(requests.size(), std::memory_order_relaxed);
  return handle;
}

void DataChannel::Loop() {
  std::vector<zmq::pollitem_t> items;
  items.push_back({commands_.handle(), 0, ZMQ_POLLIN, 0});
  for (auto& s : servers_) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  while (true) {
    PollOrInterrupted(items.data(), items.size(), std::chrono::milliseconds(-1));
    for (size_t i = 1; i < items.size(); ++i) {
      if (items[i].revents & ZMQ_POLLIN) {
        while (servers_[i - 1].get(zmq::sockopt::events) & ZMQ_POLLIN) Receive(i - 1);
      }
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t target;
      while (commands_.recv(target, zmq::recv_flags::dontwait)) {
        uint32_t server;
        std::memcpy(&server, target.data(), sizeof(server));
        if (server == kStop) return;
        Forward(server);
      }
    }
  }
}

void DataChannel::Forward(uint32_t server) {
  // Frames after the target: [header][payload?], passed on without copying.
  zmq::message_t frame;
  bool more = true;
  while (more) {
    (void)commands_.recv(frame);
    more = frame.more();
    if (server < servers_.size()) {
      servers_[server].send(frame, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

void DataChannel::Receive(size_t server) {
  zmq::message_t head, payload;
  if (!servers_[server].recv(head, zmq::recv_flags::dontwait)) return;
  bool has_payload = false;
  bool more = head.more();
  if (more) {
    (void)servers_[server].recv(payload);
    has_payload = true;
    more = payload.more();
  }
  while (more) {
    zmq::message_t extra;
    (void)servers_[server].recv(extra);
    more = extra.more();
  }
  response_.Clear();
  absl::Status s = ParseDataHeaderInto(head.data(), head.size(), &response_);
  if (!s.ok()) {
    LOG(WARNING) << "worker " << rank_ << ": dropped a bad answer from server " << server << ": " << s;
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(response_.request_id());
  if (it == pending_.end()) return;  // its handle timed out; nothing waits for it
  const Pending& p = it->second;
  s = ResponseStatus(response_);
  if (has_payload) bytes_received_.fetch_add(payload.size(), std::memory_order_relaxed);
  if (s.ok() && p.on_answer) {
    s = has_payload ? p.on_answer(response_, payload)
                    : absl::DataLossError(absl::StrCat("answer for partition ", p.partition, " has no payload"));
  } else if (s.ok() && p.out != nullptr) {
    const size_t bytes = p.num_elements * sizeof(float);
    if (!has_payload || !response_.codec().empty() || response_.num_elements() != p.num_elements ||
        payload.size() != bytes) {
      s = absl::DataLossError(absl::StrCat("answer for partition ", p.partition, " carries ",
                                           has_payload ? payload.size() : 0, " bytes, expected ", bytes));
    } else {
      std::memcpy(p.out, payload.data(), bytes);
    }
  }
  Complete(response_.request_id(), s);
}

void DataChannel::Complete(uint64_t request_id, const absl::Status& status) {
  auto it = pending_.find(request_id);
  const Pending p = it->second;
  pending_.erase(it);
  HandleState& h = handles_[p.handle];
  if (!status.ok() && h.status.ok()) {
    h.status = absl::Status(status.code(), absl::StrCat(h.what, ": server ", p.server, " (", addresses_[p.server],
                                                        "), partition ", p.partition, ": ", status.message()));
  }
  --h.remaining;
}

std::string DataChannel::Outstanding(const HandleState& h) const {
  std::vector<std::string> parts;
  for (uint64_t id : h.request_ids) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    parts.push_back(absl::StrCat("server ", it->second.server, " (", addresses_[it->second.server], ") partition ",
                                 it->second.partition));
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status DataChannel::Wait(uint64_t handle, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown handle ", handle, " (already waited on?)"));
  }
  HandleState& h = it->second;
  auto done = [&h]() { return h.remaining == 0; };
  absl::Status result;
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    result = absl::DeadlineExceededError(absl::StrCat(h.what, ": no answer within ", absl::FormatDuration(timeout),
                                                      " from ", Outstanding(h)));
    for (uint64_t id : h.request_ids) pending_.erase(id);
  } else {
    result = h.status;
  }
  handles_.erase(it);
  return result;
}

}  // namespace shardps
