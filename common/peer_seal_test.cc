#include "common/peer_seal.h"

#include <cstring>
#include <numeric>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

CurveKeyPair Keys() {
  auto k = NewCurveKeyPair();
  EXPECT_TRUE(k.ok()) << k.status();
  return *k;
}

struct Sealed {
  zmq::message_t envelope, payload;
};

class PeerSealTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CurveAvailable()) GTEST_SKIP() << "this libzmq makes no Curve25519 keys";
    worker_ = Keys();
    server_ = Keys();
    auto a = PeerSeal::Create(worker_, server_.public_key, SealEnd::kConnecting);
    auto b = PeerSeal::Create(server_, worker_.public_key, SealEnd::kBinding);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    connecting_ = *std::move(a);
    binding_ = *std::move(b);
    payload_.resize(1000);
    std::iota(payload_.begin(), payload_.end(), 0.5f);
  }

  Sealed SealFromWorker(const std::string& header, bool with_payload = true) {
    Sealed s;
    absl::Status st = connecting_->Seal(header, with_payload ? payload_.data() : nullptr,
                                        with_payload ? payload_.size() * sizeof(float) : 0, &s.envelope, &s.payload);
    EXPECT_TRUE(st.ok()) << st;
    return s;
  }

  CurveKeyPair worker_, server_;
  std::unique_ptr<PeerSeal> connecting_, binding_;
  std::vector<float> payload_;
};

TEST_F(PeerSealTest, BothDirectionsRoundTripAndTheWireHoldsNoPlaintext) {
  Sealed s = SealFromWorker("header bytes");
  ASSERT_EQ(s.payload.size(), payload_.size() * sizeof(float));
  EXPECT_NE(std::memcmp(s.payload.data(), payload_.data(), s.payload.size()), 0);
  EXPECT_EQ(std::string(static_cast<const char*>(s.envelope.data()), s.envelope.size()).find("header bytes"),
            std::string::npos);
  std::string header;
  ASSERT_TRUE(binding_->Open(s.envelope, &s.payload, &header).ok());
  EXPECT_EQ(header, "header bytes");
  EXPECT_EQ(std::memcmp(s.payload.data(), payload_.data(), s.payload.size()), 0);

  Sealed back;
  ASSERT_TRUE(binding_->Seal("answer", nullptr, 0, &back.envelope, &back.payload).ok());
  ASSERT_TRUE(connecting_->Open(back.envelope, nullptr, &header).ok());
  EXPECT_EQ(header, "answer");
}

TEST_F(PeerSealTest, SenderIsNamedByItsPublicKey) {
  Sealed s = SealFromWorker("h");
  auto sender = SealedSender(s.envelope);
  ASSERT_TRUE(sender.ok());
  EXPECT_EQ(std::string(*sender), *DecodeZ85Key(worker_.public_key));
}

TEST_F(PeerSealTest, ReorderedMessagesOpenOnceAndReplaysAreRefused) {
  Sealed first = SealFromWorker("1");
  Sealed second = SealFromWorker("2");
  zmq::message_t first_envelope(first.envelope.data(), first.envelope.size());
  zmq::message_t first_payload(first.payload.data(), first.payload.size());
  std::string header;
  ASSERT_TRUE(binding_->Open(second.envelope, &second.payload, &header).ok());
  ASSERT_TRUE(binding_->Open(first.envelope, &first.payload, &header).ok()) << "a reordered message opens";
  EXPECT_EQ(header, "1");
  absl::Status again = binding_->Open(first_envelope, &first_payload, &header);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  Sealed third = SealFromWorker("3");
  zmq::message_t third_envelope;
  third_envelope.copy(third.envelope);
  zmq::message_t third_payload(third.payload.data(), third.payload.size());  // a real copy
  ASSERT_TRUE(binding_->Open(third.envelope, &third.payload, &header).ok());
  absl::Status replay = binding_->Open(third_envelope, &third_payload, &header);
  EXPECT_EQ(replay.code(), absl::StatusCode::kAlreadyExists) << replay;
  EXPECT_EQ(binding_->refused(), 2u);
}

TEST_F(PeerSealTest, MessagesOlderThanTheWindowAreRefused) {
  Sealed old = SealFromWorker("old");
  Sealed kept = SealFromWorker("kept");
  std::string header;
  for (uint64_t i = 0; i < kReplayWindow - 1; ++i) {
    Sealed s = SealFromWorker("filler", /*with_payload=*/false);
    ASSERT_TRUE(binding_->Open(s.envelope, nullptr, &header).ok());
  }
  // "kept" is kReplayWindow - 1 behind the highest: still inside.
  ASSERT_TRUE(binding_->Open(kept.envelope, &kept.payload, &header).ok());
  absl::Status too_old = binding_->Open(old.envelope, &old.payload, &header);
  EXPECT_EQ(too_old.code(), absl::StatusCode::kAlreadyExists) << too_old;
}

TEST_F(PeerSealTest, AnOversizedEnvelopeIsRefusedBeforeAnyWork) {
  zmq::message_t huge(kSealedEnvelopeOverhead + 4096 + 1);
  std::memset(huge.data(), 0, huge.size());
  std::string header;
  absl::Status s = binding_->Open(huge, nullptr, &header);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("at most 4096"));
}

TEST_F(PeerSealTest, AnyFlippedBitIsRefusedAndAcceptsNothing) {
  for (int target = 0; target < 4; ++target) {
    Sealed s = SealFromWorker("a header of some length");
    unsigned char* bytes;
    size_t offset;
    switch (target) {
      case 0:  // the sender key
        bytes = static_cast<unsigned char*>(s.envelope.data()), offset = 3;
        break;
      case 1:  // the bound payload tag
        bytes = static_cast<unsigned char*>(s.envelope.data()), offset = 45;
        break;
      case 2:  // the header ciphertext
        bytes = static_cast<unsigned char*>(s.envelope.data()), offset = 60;
        break;
      default:  // the payload
        bytes = static_cast<unsigned char*>(s.payload.data()), offset = 2000;
        break;
    }
    bytes[offset] ^= 0x10;
    std::string header = "untouched";
    absl::Status st = binding_->Open(s.envelope, &s.payload, &header);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << "target " << target << ": " << st;
    EXPECT_EQ(header, "untouched");
  }
  // The refusals moved no counter: the next genuine message opens.
  Sealed good = SealFromWorker("good");
  std::string header;
  EXPECT_TRUE(binding_->Open(good.envelope, &good.payload, &header).ok());
}

TEST_F(PeerSealTest, AStrippedOrAddedPayloadFrameIsRefused) {
  Sealed with = SealFromWorker("with");
  std::string header;
  EXPECT_EQ(binding_->Open(with.envelope, nullptr, &header).code(), absl::StatusCode::kPermissionDenied);
  Sealed without = SealFromWorker("without", /*with_payload=*/false);
  zmq::message_t extra(16);
  std::memset(extra.data(), 0, 16);
  EXPECT_EQ(binding_->Open(without.envelope, &extra, &header).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(PeerSealTest, AnotherNodesKeysCannotOpen) {
  CurveKeyPair intruder = Keys();
  auto forged = PeerSeal::Create(intruder, server_.public_key, SealEnd::kConnecting);
  ASSERT_TRUE(forged.ok());
  Sealed s;
  ASSERT_TRUE((*forged)->Seal("forged", payload_.data(), 16, &s.envelope, &s.payload).ok());
  std::string header;
  EXPECT_EQ(binding_->Open(s.envelope, &s.payload, &header).code(), absl::StatusCode::kPermissionDenied);
  // Nor does a message sealed for another receiver.
  auto other = PeerSeal::Create(Keys(), worker_.public_key, SealEnd::kBinding);
  ASSERT_TRUE(other.ok());
  Sealed mine = SealFromWorker("for the server");
  EXPECT_EQ((*other)->Open(mine.envelope, &mine.payload, &header).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(PeerSealTest, ShortOrMalformedInputIsRefusedNotCrashed) {
  zmq::message_t tiny(5);
  std::string header;
  EXPECT_EQ(binding_->Open(tiny, nullptr, &header).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(SealedSender(tiny).ok());
  EXPECT_FALSE(DecodeZ85Key("short").ok());
  EXPECT_FALSE(PeerSeal::Create(worker_, "not a key", SealEnd::kConnecting).ok());
  // The all-zero point (small order) gives no key.
  std::string zero_z85 = "0000000000000000000000000000000000000000";
  EXPECT_FALSE(PeerSeal::Create(worker_, zero_z85, SealEnd::kConnecting).ok());
}

TEST(PeerSealsTest, OnlyAdmittedSendersAreFoundAndAReturningPeerKeepsItsCounters) {
  if (!CurveAvailable()) GTEST_SKIP() << "this libzmq makes no Curve25519 keys";
  CurveKeyPair server = Keys(), worker = Keys();
  PeerSeals seals(server, SealEnd::kBinding);
  const std::string raw = *DecodeZ85Key(worker.public_key);
  EXPECT_EQ(seals.Admitted(raw), nullptr);
  seals.Admit({worker.public_key, "malformed"});
  PeerSeal* seal = seals.Admitted(raw);
  ASSERT_NE(seal, nullptr);
  auto sender = PeerSeal::Create(worker, server.public_key, SealEnd::kConnecting);
  ASSERT_TRUE(sender.ok());
  zmq::message_t envelope, payload;
  ASSERT_TRUE((*sender)->Seal("one", nullptr, 0, &envelope, &payload).ok());
  zmq::message_t kept;
  kept.copy(envelope);
  std::string header;
  ASSERT_TRUE(seal->Open(envelope, nullptr, &header).ok());
  seals.Admit({});
  EXPECT_EQ(seals.Admitted(raw), nullptr);
  seals.Admit({worker.public_key});
  ASSERT_EQ(seals.Admitted(raw), seal);  // the same state: the old message stays a replay
  EXPECT_EQ(seal->Open(kept, nullptr, &header).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace shardps
