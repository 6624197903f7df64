#include "scheduler/node_rates.h"

namespace shardps {

NodeRates RatesBetween(const NodeCounters& before, const NodeCounters& now, double seconds) {
  auto rate = [seconds](uint64_t a, uint64_t b) { return b >= a ? static_cast<double>(b - a) / seconds : 0.0; };
  NodeRates r;
  r.set_rounds(rate(before.rounds_completed(), now.rounds_completed()));
  r.set_updates(rate(before.updates_applied(), now.updates_applied()));
  r.set_bytes_in(rate(before.bytes_in(), now.bytes_in()));
  r.set_bytes_out(rate(before.bytes_out(), now.bytes_out()));
  r.set_requests(rate(before.requests(), now.requests()));
  r.set_requests_refused(rate(before.requests_refused(), now.requests_refused()));
  r.set_steps(rate(before.steps(), now.steps()));
  return r;
}

}  // namespace shardps
