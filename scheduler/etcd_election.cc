#include "scheduler/etcd_election.h"

#include <algorithm>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "scheduler/etcd_client.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<EtcdElection>> EtcdElection::Create(const Options& options) {
  if (options.prefix.empty() || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("--etcd-prefix '", options.prefix,
                                                   "': give a non-empty prefix without a trailing '/'"));
  }
  auto client = EtcdClient::Create(options.endpoints, options.tls);
  if (!client.ok()) return client.status();
  auto election = std::unique_ptr<EtcdElection>(new EtcdElection(options, *std::move(client)));
  absl::MutexLock lock(&election->mu_);
  if (absl::Status s = election->Grant(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--etcd ", options.endpoints, ": ", s.message()));
  }
  return election;
}

EtcdElection::EtcdElection(const Options& options, std::unique_ptr<EtcdClient> client)
    : options_(options),
      leader_key_(options.prefix + "/leader"),
      state_key_(options.prefix + "/state"),
      client_(std::move(client)) {}

EtcdElection::~EtcdElection() {
  absl::MutexLock lock(&mu_);
  if (lease_ == 0) return;
  absl::Status s = client_->RevokeLease(lease_);
  if (!s.ok() && !absl::IsNotFound(s)) {  // NotFound: it had expired already
    LOG(WARNING) << "scheduler: could not hand back its etcd lease (" << s << "); " << leader_key_
                 << " goes when it expires";
  }
}

absl::Duration EtcdElection::poll_period() const { return std::min(absl::Milliseconds(250), options_.ttl / 8); }

absl::Status EtcdElection::Grant() {
  const absl::Time sent = absl::Now();
  auto granted = client_->GrantLease(options_.ttl);
  if (!granted.ok()) return granted.status();
  lease_ = granted->first;
  ttl_ = granted->second;
  renewed_ = sent;
  valid_until_ = sent + ttl_;
  return absl::OkStatus();
}

absl::StatusOr<bool> EtcdElection::Campaign(std::string* active) {
  absl::MutexLock lock(&mu_);
  if (leader_revision_ != 0) return true;
  bool created = false;
  auto leader = client_->CreateIfAbsent(leader_key_, options_.address, lease_, &created);
  if (!leader.ok()) return leader.status();
  if (created) {
    leader_revision_ = leader->create_revision;
    return true;
  }
  *active = leader->value;
  seen_revision_ = leader->read_revision;
  return false;
}

absl::StatusOr<bool> EtcdElection::AwaitLeaderGone(absl::Duration timeout) {
  int64_t seen = 0;
  {
    absl::MutexLock lock(&mu_);
    seen = seen_revision_;
  }
  if (seen == 0) return true;  // no lost campaign yet: campaign first
  // Held at `seen`: any deletion comes at a later revision.
  return client_->AwaitDeletion(leader_key_, seen + 1, timeout);
}

void EtcdElection::CancelWaits() { client_->CancelWaits(); }

absl::Duration EtcdElection::UntilRenewal() {
  absl::MutexLock lock(&mu_);
  return std::max(absl::ZeroDuration(), renewed_ + ttl_ / 3 - absl::Now());
}

absl::Status EtcdElection::KeepAlive() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - renewed_ < ttl_ / 3) return absl::OkStatus();
  auto renewed = client_->KeepAlive(lease_);
  if (renewed.ok()) {
    renewed_ = now;
    valid_until_ = now + *renewed;
    return absl::OkStatus();
  }
  if (leader_revision_ == 0) {  // a standby: take a new lease when this one is gone
    return absl::IsNotFound(renewed.status()) ? Grant() : renewed.status();
  }
  if (absl::IsNotFound(renewed.status())) {
    // Not always so: a leader member resumed after a pause (SIGSTOP) answers
    // for the leases it knows until it hears of its successor, and says a
    // lease granted meanwhile is not found. P/leader goes with the lease, so
    // a linearizable read of it (which such a member cannot answer) settles it.
    auto leader = client_->Get(leader_key_);
    const bool gone = leader.ok() && (!leader->has_value() || (*leader)->create_revision != leader_revision_ ||
                                      (*leader)->lease != lease_);
    if (gone) {
      return absl::FailedPreconditionError(absl::StrCat("lost its etcd lease (", renewed.status().message(), "), so ",
                                                        leader_key_, " may be another scheduler's"));
    }
    LOG(WARNING) << "scheduler: " << renewed.status().message() << ", but "
                 << (leader.ok() ? absl::StrCat(leader_key_, " still stands on it")
                                 : absl::StrCat("reading ", leader_key_, " failed (", leader.status().message(), ")"))
                 << "; renewing again";
    renewed = absl::UnavailableError(renewed.status().message());
  }
  if (absl::Now() >= valid_until_) {
    return absl::FailedPreconditionError(absl::StrCat("could not renew its etcd lease for ",
                                                      absl::FormatDuration(ttl_), " (", renewed.status().message(),
                                                      "), so ", leader_key_, " may be another scheduler's"));
  }
  return renewed.status();  // transient: the lease still lives, try again at the next poll
}

absl::StatusOr<std::optional<std::string>> EtcdElection::LoadState() {
  auto kv = client_->Get(state_key_);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::nullopt;
  return (*kv)->value;
}

absl::Status EtcdElection::StoreState(const std::string& bytes) {
  return client_->PutIfGuarded(state_key_, bytes, leader_key_, leader_revision_.load());
}

}  // namespace shardps
