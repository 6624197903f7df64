#include "common/peer_seal.h"

#include <openssl/evp.h>
#include <zmq.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/data_message.h"
#include "common/protocol.h"

namespace shardps {
namespace {

constexpr size_t kKeyBytes = 32;
constexpr size_t kCounterBytes = 8;
constexpr size_t kTagBytes = 16;
constexpr size_t kBoundBytes = kKeyBytes + kCounterBytes + kTagBytes;  // the header's additional data
constexpr char kDerivationLabel[] = "shardps data seal v1";

using Nonce = std::array<unsigned char, 12>;

Nonce MakeNonce(uint32_t part, uint64_t counter) {
  Nonce n{};
  for (int i = 0; i < 4; ++i) n[i] = static_cast<unsigned char>(part >> (8 * i));
  for (int i = 0; i < 8; ++i) n[4 + i] = static_cast<unsigned char>(counter >> (8 * i));
  return n;
}

void PutCounter(uint64_t counter, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(counter >> (8 * i));
}

uint64_t GetCounter(const unsigned char* in) {
  uint64_t c = 0;
  for (int i = 7; i >= 0; --i) c = (c << 8) | in[i];
  return c;
}

// X25519(own secret, peer public), then SHA-512 over a label, the shared
// secret and both public keys (the connecting end's first): the first half
// is the connecting end's sending key, the second the binding end's.
absl::StatusOr<std::array<unsigned char, 64>> DeriveKeys(const std::string& own_secret, const std::string& own_public,
                                                         const std::string& peer_public, SealEnd end) {
  EVP_PKEY* own = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr,
                                               reinterpret_cast<const unsigned char*>(own_secret.data()), kKeyBytes);
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr,
                                               reinterpret_cast<const unsigned char*>(peer_public.data()), kKeyBytes);
  EVP_PKEY_CTX* ctx = own != nullptr ? EVP_PKEY_CTX_new(own, nullptr) : nullptr;
  unsigned char shared[kKeyBytes];
  size_t shared_len = sizeof(shared);
  const bool derived = ctx != nullptr && peer != nullptr && EVP_PKEY_derive_init(ctx) == 1 &&
                       EVP_PKEY_derive_set_peer(ctx, peer) == 1 && EVP_PKEY_derive(ctx, shared, &shared_len) == 1 &&
                       shared_len == kKeyBytes;
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  EVP_PKEY_free(own);
  // X25519 refuses a peer key of small order (an all-zero shared secret).
  if (!derived) return absl::InvalidArgumentError("X25519 with the peer's public key failed (not a valid key)");
  const std::string& connecting = end == SealEnd::kConnecting ? own_public : peer_public;
  const std::string& binding = end == SealEnd::kConnecting ? peer_public : own_public;
  std::string input(kDerivationLabel);
  input.append(reinterpret_cast<const char*>(shared), sizeof(shared));
  input += connecting;
  input += binding;
  OPENSSL_cleanse(shared, sizeof(shared));
  std::array<unsigned char, 64> keys;
  unsigned int len = 0;
  const bool hashed = EVP_Digest(input.data(), input.size(), keys.data(), &len, EVP_sha512(), nullptr) == 1;
  OPENSSL_cleanse(input.data(), input.size());
  if (!hashed || len != keys.size()) return absl::InternalError("SHA-512 of the shared secret failed");
  return keys;
}

}  // namespace

// One direction's AES-256-GCM context, its key set once.
struct PeerSeal::Cipher {
  EVP_CIPHER_CTX* ctx = nullptr;
  bool encrypt = true;
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }

  static std::unique_ptr<Cipher> Make(const unsigned char* key, bool encrypt) {
    auto c = std::make_unique<Cipher>();
    c->encrypt = encrypt;
    c->ctx = EVP_CIPHER_CTX_new();
    if (c->ctx == nullptr) return nullptr;
    const int ok = encrypt ? EVP_EncryptInit_ex(c->ctx, EVP_aes_256_gcm(), nullptr, key, nullptr)
                           : EVP_DecryptInit_ex(c->ctx, EVP_aes_256_gcm(), nullptr, key, nullptr);
    return ok == 1 ? std::move(c) : nullptr;
  }

  // Encrypts or decrypts `n` bytes from `in` to `out` (may be equal) under
  // `nonce` with additional data `aad`; sealing writes the tag to `tag`,
  // opening checks it. False on failure (a wrong tag when opening).
  bool Run(const Nonce& nonce, const unsigned char* aad, size_t aad_len, const unsigned char* in, size_t n,
           unsigned char* out, unsigned char* tag) {
    int len = 0;
    const int init = encrypt ? EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data())
                             : EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data());
    if (init != 1) return false;
    auto update = [&](unsigned char* o, const unsigned char* i, size_t k) {
      return encrypt ? EVP_EncryptUpdate(ctx, o, &len, i, static_cast<int>(k))
                     : EVP_DecryptUpdate(ctx, o, &len, i, static_cast<int>(k));
    };
    if (aad_len > 0 && update(nullptr, aad, aad_len) != 1) return false;
    constexpr size_t kChunk = size_t{1} << 30;  // the API counts in int
    for (size_t done = 0; done < n;) {
      const size_t k = std::min(kChunk, n - done);
      if (update(out + done, in + done, k) != 1) return false;
      done += k;
    }
    if (encrypt) {
      return EVP_EncryptFinal_ex(ctx, out + n, &len) == 1 &&
             EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
    }
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
           EVP_DecryptFinal_ex(ctx, out + n, &len) == 1;
  }
};

absl::StatusOr<absl::string_view> SealedSender(const zmq::message_t& envelope) {
  if (envelope.size() < kSealedEnvelopeOverhead) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed envelope of ", envelope.size(), " bytes (at least ", kSealedEnvelopeOverhead, ")"));
  }
  return absl::string_view(static_cast<const char*>(envelope.data()), kKeyBytes);
}

absl::StatusOr<std::string> DecodeZ85Key(absl::string_view z85) {
  if (z85.size() != 40) return absl::InvalidArgumentError(absl::StrCat("key has ", z85.size(), " characters (Z85: 40)"));
  const std::string text(z85);
  std::string raw(kKeyBytes, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), text.c_str()) == nullptr) {
    return absl::InvalidArgumentError("key is not Z85");
  }
  return raw;
}

absl::StatusOr<std::unique_ptr<PeerSeal>> PeerSeal::Create(const CurveKeyPair& own, absl::string_view peer_public,
                                                           SealEnd end) {
  auto own_public = DecodeZ85Key(own.public_key);
  auto own_secret = DecodeZ85Key(own.secret_key);
  auto peer = DecodeZ85Key(peer_public);
  for (const auto* k : {&own_public, &own_secret, &peer}) {
    if (!k->ok()) return absl::InvalidArgumentError(absl::StrCat("data seal: ", k->status().message()));
  }
  auto keys = DeriveKeys(*own_secret, *own_public, *peer, end);
  OPENSSL_cleanse(own_secret->data(), own_secret->size());
  if (!keys.ok()) return absl::Status(keys.status().code(), absl::StrCat("data seal: ", keys.status().message()));
  const unsigned char* connecting_sends = keys->data();
  const unsigned char* binding_sends = keys->data() + 32;
  const bool connecting = end == SealEnd::kConnecting;
  auto sealer = Cipher::Make(connecting ? connecting_sends : binding_sends, /*encrypt=*/true);
  auto opener = Cipher::Make(connecting ? binding_sends : connecting_sends, /*encrypt=*/false);
  OPENSSL_cleanse(keys->data(), keys->size());
  if (!sealer || !opener) return absl::InternalError("data seal: cannot set up AES-256-GCM");
  return std::unique_ptr<PeerSeal>(new PeerSeal(*std::move(own_public), std::move(sealer), std::move(opener)));
}

PeerSeal::PeerSeal(std::string own_public_raw, std::unique_ptr<Cipher> sealer, std::unique_ptr<Cipher> opener)
    : own_public_raw_(std::move(own_public_raw)), sealer_(std::move(sealer)), opener_(std::move(opener)) {}

PeerSeal::~PeerSeal() = default;

absl::Status PeerSeal::Seal(absl::string_view header, const void* payload, size_t payload_bytes,
                            zmq::message_t* envelope, zmq::message_t* sealed_payload) {
  const uint64_t counter = next_counter_++;
  zmq::message_t env(kSealedEnvelopeOverhead + header.size());
  auto* e = static_cast<unsigned char*>(env.data());
  std::memcpy(e, own_public_raw_.data(), kKeyBytes);
  PutCounter(counter, e + kKeyBytes);
  unsigned char* payload_tag = e + kKeyBytes + kCounterBytes;
  std::memset(payload_tag, 0, kTagBytes);
  if (payload != nullptr) {
    zmq::message_t sealed(payload_bytes);
    if (!sealer_->Run(MakeNonce(1, counter), nullptr, 0, static_cast<const unsigned char*>(payload), payload_bytes,
                      static_cast<unsigned char*>(sealed.data()), payload_tag)) {
      return absl::InternalError("data seal: AES-256-GCM sealing of a payload failed");
    }
    *sealed_payload = std::move(sealed);
  }
  unsigned char* body = e + kBoundBytes;
  if (!sealer_->Run(MakeNonce(0, counter), e, kBoundBytes, reinterpret_cast<const unsigned char*>(header.data()),
                    header.size(), body, body + header.size())) {
    return absl::InternalError("data seal: AES-256-GCM sealing of a header failed");
  }
  *envelope = std::move(env);
  return absl::OkStatus();
}

absl::Status PeerSeal::Open(const zmq::message_t& envelope, zmq::message_t* payload, std::string* header) {
  if (envelope.size() < kSealedEnvelopeOverhead || envelope.size() > kSealedEnvelopeOverhead + kMaxHeaderBytes) {
    ++refused_;
    return absl::PermissionDeniedError(absl::StrCat("not a sealed message (an envelope of ", envelope.size(),
                                                    " bytes; a header holds at most ", kMaxHeaderBytes, ")"));
  }
  const auto* e = static_cast<const unsigned char*>(envelope.data());
  const uint64_t counter = GetCounter(e + kKeyBytes);
  if (!Fresh(counter)) {
    ++refused_;
    return absl::AlreadyExistsError(
        absl::StrCat("replayed sealed message (counter ", counter, ", highest accepted ", last_opened_, ")"));
  }
  const size_t header_bytes = envelope.size() - kSealedEnvelopeOverhead;
  // Opened into a buffer kept across messages: no allocation per message.
  std::string& plain = opened_header_;
  plain.resize(header_bytes);
  unsigned char tag[kTagBytes];
  std::memcpy(tag, e + kBoundBytes + header_bytes, kTagBytes);
  if (!opener_->Run(MakeNonce(0, counter), e, kBoundBytes, e + kBoundBytes, header_bytes,
                    reinterpret_cast<unsigned char*>(plain.data()), tag)) {
    ++refused_;
    return absl::PermissionDeniedError("sealed header fails authentication (wrong key or tampered)");
  }
  const unsigned char* payload_tag = e + kKeyBytes + kCounterBytes;
  if (payload == nullptr && std::any_of(payload_tag, payload_tag + kTagBytes, [](unsigned char b) { return b != 0; })) {
    ++refused_;
    return absl::PermissionDeniedError("sealed message lost its payload frame");
  }
  if (payload != nullptr) {
    std::memcpy(tag, payload_tag, kTagBytes);
    auto* p = static_cast<unsigned char*>(payload->data());
    if (!opener_->Run(MakeNonce(1, counter), nullptr, 0, p, payload->size(), p, tag)) {
      ++refused_;
      return absl::PermissionDeniedError("sealed payload fails authentication (tampered)");
    }
  }
  Accept(counter);
  header->assign(plain);
  return absl::OkStatus();
}

bool PeerSeal::Fresh(uint64_t counter) const {
  if (counter > last_opened_) return true;
  const uint64_t behind = last_opened_ - counter;
  if (counter == 0 || behind >= kReplayWindow) return false;
  return (seen_[behind / 64] >> (behind % 64) & 1) == 0;
}

void PeerSeal::Accept(uint64_t counter) {
  if (counter > last_opened_) {
    const uint64_t shift = counter - last_opened_;
    std::array<uint64_t, kReplayWindow / 64> moved{};
    if (shift < kReplayWindow) {
      // Bit i moves to bit i + shift.
      const uint64_t words = shift / 64, bits = shift % 64;
      for (size_t w = moved.size(); w-- > words;) {
        uint64_t v = seen_[w - words] << bits;
        if (bits != 0 && w - words > 0) v |= seen_[w - words - 1] >> (64 - bits);
        moved[w] = v;
      }
    }
    seen_ = moved;
    last_opened_ = counter;
  }
  const uint64_t behind = last_opened_ - counter;
  seen_[behind / 64] |= uint64_t{1} << (behind % 64);
}

absl::Status SealMessage(PeerSeal& seal, DataHeader& header, bool has_payload, const void* payload,
                         size_t payload_bytes, zmq::message_t* envelope, zmq::message_t* sealed_payload) {
  static const char kEmpty = 0;
  const zmq::message_t head = HeaderFrame(header);
  const void* bytes = !has_payload ? nullptr : payload != nullptr ? payload : &kEmpty;
  return seal.Seal(absl::string_view(static_cast<const char*>(head.data()), head.size()), bytes,
                   has_payload ? payload_bytes : 0, envelope, sealed_payload);
}

absl::Status OpenMessage(PeerSeal& seal, const zmq::message_t& envelope, zmq::message_t* payload,
                         DataHeader* header) {
  thread_local std::string bytes;  // reused: one header per data message
  if (absl::Status s = seal.Open(envelope, payload, &bytes); !s.ok()) return s;
  return ParseDataHeaderInto(bytes.data(), bytes.size(), header);
}

absl::StatusOr<PeerSeal*> PeerSeals::For(absl::string_view peer_public) {
  auto raw = DecodeZ85Key(peer_public);
  if (!raw.ok()) return raw.status();
  auto it = by_raw_key_.find(*raw);
  if (it != by_raw_key_.end()) return it->second.get();
  auto made = PeerSeal::Create(own_, peer_public, end_);
  if (!made.ok()) return made.status();
  return by_raw_key_.emplace(*std::move(raw), *std::move(made)).first->second.get();
}

void PeerSeals::Admit(const std::vector<std::string>& z85_keys) {
  admitted_.clear();
  for (const std::string& k : z85_keys) {
    auto raw = DecodeZ85Key(k);
    if (raw.ok()) admitted_.insert(*std::move(raw));
  }
}

PeerSeal* PeerSeals::Admitted(absl::string_view sender_raw) {
  if (!admitted_.contains(sender_raw)) return nullptr;
  auto it = by_raw_key_.find(sender_raw);
  if (it != by_raw_key_.end()) return it->second.get();
  char z85[41];
  if (sender_raw.size() != kKeyBytes ||
      zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(sender_raw.data()), kKeyBytes) == nullptr) {
    return nullptr;
  }
  auto made = For(absl::string_view(z85, 40));
  return made.ok() ? *made : nullptr;
}

}  // namespace shardps
