#include "scheduler/etcd_tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"

namespace shardps {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Cert = std::unique_ptr<X509, CertFree>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

std::unique_ptr<BIO, BioFree> ReadOnlyBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The content of the file `flag` names; errors name both.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  auto data = ReadWholeFile(path);
  if (!data.ok()) return absl::Status(data.status().code(), absl::StrCat(flag, ": ", data.status().message()));
  if (data->empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the file is empty"));
  return *std::move(data);
}

// The first certificate of `pem`; InvalidArgument naming `flag` and `path`.
absl::StatusOr<Cert> FirstCertificate(const std::string& pem, absl::string_view flag, const std::string& path) {
  auto bio = ReadOnlyBio(pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();  // leave no stale error behind for gRPC's own OpenSSL calls
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": holds no PEM certificate"));
  }
  return cert;
}

// Checks that `key_pem` is a private key and the one of `cert`.
absl::Status CheckKey(const std::string& key_pem, X509* cert, const EtcdTlsFiles& files) {
  auto bio = ReadOnlyBio(key_pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-key ", files.key_file, ": holds no PEM private key (an encrypted key is not supported)"));
  }
  if (X509_check_private_key(cert, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--etcd-key ", files.key_file, " is not the key of --etcd-cert ",
                                                   files.cert_file));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EtcdTlsPem> LoadEtcdTls(const EtcdTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError("--etcd-cert and --etcd-key go together: give both or neither");
  }
  EtcdTlsPem pem;
  auto ca = ReadPem(files.ca_file, "--etcd-ca");
  if (!ca.ok()) return ca.status();
  pem.ca = *std::move(ca);
  if (auto first = FirstCertificate(pem.ca, "--etcd-ca", files.ca_file); !first.ok()) return first.status();
  if (files.cert_file.empty()) return pem;
  auto cert = ReadPem(files.cert_file, "--etcd-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(files.key_file, "--etcd-key");
  if (!key.ok()) return key.status();
  auto parsed = FirstCertificate(*cert, "--etcd-cert", files.cert_file);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckKey(*key, parsed->get(), files); !s.ok()) return s;
  pem.cert = *std::move(cert);
  pem.key = *std::move(key);
  return pem;
}

}  // namespace shardps
