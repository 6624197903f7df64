#include "tools/cluster_credentials.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <google/protobuf/text_format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/durable_file.h"
#include "proto/config.pb.h"

namespace shardps {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

absl::Status OpenSslError(absl::string_view what) {
  return absl::InternalError(absl::StrCat("cannot make the test credentials: ", what));
}

// Writes `data` to `path` readable by the owner only (`secret`) or by all.
absl::Status WriteFile(const std::string& path, const std::string& data, bool secret) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, secret ? 0600 : 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  if (secret) fchmod(fd, 0600);  // an existing file keeps its mode otherwise
  const bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer` (null: self-signed
// CA), with the extensions given (NID -> value).
absl::StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                              const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  BIGNUM* serial = BN_new();
  bool ok = cert && serial && BN_rand(serial, 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
            BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial);
  if (!ok) return OpenSslError("serial number");
  X509_set_version(cert.get(), 2);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("ShardPS test cluster"),
                             -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  for (const auto& [nid, value] : extensions) {
    if (!AddExtension(cert.get(), signer, nid, value)) return OpenSslError(absl::StrCat("extension ", value));
  }
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) {
    return OpenSslError(absl::StrCat("signing ", cn));
  }
  return cert;
}

std::string CertPem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, n);
  BIO_free(bio);
  return out;
}

std::string KeyPem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, n);
  BIO_free(bio);
  return out;
}

// "DNS:a,IP:1.2.3.4,..." for the scheduler certificate.
absl::StatusOr<std::string> SubjectAltNames(const std::vector<std::string>& hosts) {
  std::vector<std::string> names = {"DNS:localhost", "IP:127.0.0.1"};
  for (const std::string& h : hosts) {
    if (h.empty() || h.find_first_of(", \t\n:") != std::string::npos) {
      if (in6_addr a6; inet_pton(AF_INET6, h.c_str(), &a6) == 1) {
        names.push_back("IP:" + h);
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("--hosts: '", h, "' is not a host name or IP address"));
    }
    in_addr a4;
    names.push_back(absl::StrCat(inet_pton(AF_INET, h.c_str(), &a4) == 1 ? "IP:" : "DNS:", h));
  }
  return absl::StrJoin(names, ",");
}

ClusterConfig SecurityConfigOf(const std::string& dir, const std::string& own, bool mutual) {
  ClusterConfig config;
  SecurityConfig* s = config.mutable_security();
  s->set_enabled(true);
  s->set_token_file(dir + "/token");
  s->set_tls_ca_file(dir + "/ca.pem");
  s->set_tls_cert_file(absl::StrCat(dir, "/", own, ".pem"));
  s->set_tls_key_file(absl::StrCat(dir, "/", own, ".key"));
  s->set_require_client_cert(mutual);
  return config;
}

std::string SecurityConfigText(const std::string& own, const ClusterConfig& config) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return absl::StrCat("# Written by shardps certs: the security block of the ", own,
                      (own == "scheduler" ? " (shardps scheduler --security-config)"
                                          : "s (servers, workers, status, checkpoint, drain: --security-config)"),
                      ".\n", text);
}

}  // namespace

absl::StatusOr<ClusterCredentialFiles> WriteClusterCredentials(const std::string& out_dir,
                                                               const std::vector<std::string>& hosts, bool mutual) {
  auto sans = SubjectAltNames(hosts);
  if (!sans.ok()) return sans.status();
  const std::string dir = std::filesystem::absolute(out_dir).lexically_normal().string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  chmod(dir.c_str(), 0700);
  Key ca_key(EVP_EC_gen("P-256")), scheduler_key(EVP_EC_gen("P-256")), node_key(EVP_EC_gen("P-256"));
  if (!ca_key || !scheduler_key || !node_key) return OpenSslError("EC key generation");
  auto ca = MakeCert(ca_key.get(), "ShardPS test CA", nullptr, nullptr,
                     {{NID_basic_constraints, "critical,CA:TRUE"},
                      {NID_key_usage, "critical,keyCertSign,cRLSign"},
                      {NID_subject_key_identifier, "hash"}});
  if (!ca.ok()) return ca.status();
  const std::vector<std::pair<int, std::string>> leaf = {{NID_basic_constraints, "critical,CA:FALSE"},
                                                         {NID_key_usage, "critical,digitalSignature"},
                                                         {NID_ext_key_usage, "serverAuth,clientAuth"},
                                                         {NID_authority_key_identifier, "keyid"}};
  auto with_sans = leaf;
  with_sans.push_back({NID_subject_alt_name, *sans});
  auto scheduler = MakeCert(scheduler_key.get(), "shardps-scheduler", ca->get(), ca_key.get(), with_sans);
  if (!scheduler.ok()) return scheduler.status();
  auto node = MakeCert(node_key.get(), "shardps-node", ca->get(), ca_key.get(), leaf);
  if (!node.ok()) return node.status();
  unsigned char random[32];
  if (RAND_bytes(random, sizeof(random)) != 1) return OpenSslError("random token");
  const std::string token = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(random), sizeof(random)));
  ClusterCredentialFiles files{dir + "/scheduler.conf", dir + "/node.conf"};
  const std::vector<std::tuple<std::string, std::string, bool>> writes = {
      {"ca.pem", CertPem(ca->get()), false},
      {"ca.key", KeyPem(ca_key.get()), true},
      {"scheduler.pem", CertPem(scheduler->get()), false},
      {"scheduler.key", KeyPem(scheduler_key.get()), true},
      {"node.pem", CertPem(node->get()), false},
      {"node.key", KeyPem(node_key.get()), true},
      {"token", token + "\n", true},
      {"scheduler.conf", SecurityConfigText("scheduler", SecurityConfigOf(dir, "scheduler", mutual)), false},
      {"node.conf", SecurityConfigText("node", SecurityConfigOf(dir, "node", mutual)), false}};
  for (const auto& [name, data, secret] : writes) {
    if (absl::Status s = WriteFile(absl::StrCat(dir, "/", name), data, secret); !s.ok()) return s;
  }
  return files;
}

absl::Status SetDataCipher(const std::string& node_config, DataCipher cipher) {
  auto config = LoadConfigFile(node_config);
  if (!config.ok()) return config.status();
  config->mutable_security()->set_data_cipher(cipher);
  return WriteFile(node_config, SecurityConfigText("node", *config), false);
}

}  // namespace shardps
