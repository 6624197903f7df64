// Fuzzes the opening of sealed data-plane messages (common/peer_seal.h), what
// a secured server does first with every frame anyone sends it: arbitrary
// envelopes and payloads, and genuine messages of an admitted sender that the
// input then flips, replays or reorders. Invariants: a message opens only if
// it is genuine, unchanged, not accepted before and within the replay window
// of the newest accepted; its header comes back as sealed; nothing crashes or
// reads out of bounds.
//
// Input: up to 64 steps, each [kind] then:
//   kind%4 == 0: [u16 len][envelope][u16 len][payload]   raw frames
//   kind%4 == 1: [u16 len][header][u16 len][payload]     a genuine message
//   kind%4 == 2: as 1, then [u16 where][u8 mask]          one byte changed
//   kind%4 == 3: [u8 which]                              a replay of a kept one
// kind & 4: no payload frame; kind & 8 (with 1): keep the message, unopened.
#include <zmq.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/peer_seal.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

// Fixed keys, so that runs are reproducible.
CurveKeyPair FixedKeys(char seed) {
  uint8_t secret[32];
  for (int i = 0; i < 32; ++i) secret[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  char secret_z85[41], public_z85[41];
  zmq_z85_encode(secret_z85, secret, 32);
  zmq_curve_public(public_z85, secret_z85);
  return {std::string(public_z85, 40), std::string(secret_z85, 40)};
}

struct Kept {
  zmq::message_t envelope, payload;
  bool has_payload;
  uint64_t order;  // the sender's sealing order
};

zmq::message_t Frame(const std::string& bytes) { return zmq::message_t(bytes.data(), bytes.size()); }

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardps;
  using namespace shardps::fuzz;
  static const CurveKeyPair worker = FixedKeys(1), server = FixedKeys(2);
  FuzzInput in(data, size);
  auto sender = PeerSeal::Create(worker, server.public_key, SealEnd::kConnecting);
  auto receiver = PeerSeal::Create(server, worker.public_key, SealEnd::kBinding);
  Require(sender.ok() && receiver.ok(), "fixed keys make seals");
  std::vector<Kept> kept;
  uint64_t sealed = 0, newest_opened = 0;
  std::set<uint64_t> accepted;
  auto acceptable = [&](uint64_t order) {
    return !accepted.contains(order) && (order > newest_opened || newest_opened - order < kReplayWindow);
  };
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const uint8_t kind = in.Byte();
    const bool has_payload = (kind & 4) == 0;
    std::string header;
    if (kind % 4 == 0) {
      zmq::message_t envelope = Frame(in.Field()), payload = Frame(in.Field());
      const bool opened = (*receiver)->Open(envelope, has_payload ? &payload : nullptr, &header).ok();
      Require(!opened, "a frame the fuzzer made up opened");
      continue;
    }
    if (kind % 4 == 3) {
      if (kept.empty()) continue;
      Kept& k = kept[in.Byte() % kept.size()];
      zmq::message_t envelope(k.envelope.data(), k.envelope.size()), payload(k.payload.data(), k.payload.size());
      const bool opened = (*receiver)->Open(envelope, k.has_payload ? &payload : nullptr, &header).ok();
      Require(opened == acceptable(k.order), "a kept message opens iff not accepted before and within the window");
      if (opened) {
        accepted.insert(k.order);
        newest_opened = std::max(newest_opened, k.order);
      }
      continue;
    }
    const std::string plain_header = in.Field(), plain_payload = in.Field();
    zmq::message_t envelope, payload;
    Require((*sender)->Seal(plain_header, has_payload ? plain_payload.data() : nullptr, plain_payload.size(), &envelope,
                            &payload)
                .ok(),
            "sealing succeeds");
    const uint64_t order = ++sealed;
    if (kind % 4 == 1 && (kind & 8)) {
      kept.push_back({zmq::message_t(envelope.data(), envelope.size()), zmq::message_t(payload.data(), payload.size()),
                      has_payload, order});
      continue;
    }
    bool changed = false;
    if (kind % 4 == 2) {
      const size_t where = in.Int(2);
      const uint8_t mask = in.Byte();
      zmq::message_t& target = where % 2 == 0 || !has_payload ? envelope : payload;
      if (target.size() > 0 && mask != 0) {
        static_cast<uint8_t*>(target.data())[(where / 2) % target.size()] ^= mask;
        changed = true;
      }
    }
    const bool opened = (*receiver)->Open(envelope, has_payload ? &payload : nullptr, &header).ok();
    Require(opened == (!changed && acceptable(order)), "a message opens iff genuine, unchanged and new");
    if (opened) {
      accepted.insert(order);
      newest_opened = std::max(newest_opened, order);
      Require(header == plain_header, "the header comes back as sealed");
      Require(!has_payload || std::string(static_cast<const char*>(payload.data()), payload.size()) == plain_payload,
              "the payload comes back as sealed");
    }
  }
  return 0;
}
