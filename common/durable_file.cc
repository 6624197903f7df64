#include "common/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr absl::string_view kMagic = "SPSREC1\n";
constexpr size_t kKindBytes = 16;
constexpr size_t kHeaderBytes = 8 + kKindBytes + 8 + 8;

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

}  // namespace

uint64_t Fnv1a64(absl::string_view data) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());  // two writers never share one
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  // A write that failed (a full disk above all) removes its temp file: left
  // behind, each one would keep the space a retry needs.
  auto fail = [&](absl::string_view what) {
    absl::Status s = Errno(what, tmp);
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return s;
  };
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail("cannot fsync");
  close(fd);
  fd = -1;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename into place");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = std::filesystem::current_path();
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return Errno("cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("cannot read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::string SealRecord(absl::string_view kind, absl::string_view payload) {
  std::string out(kMagic);
  std::string k(kind.substr(0, kKindBytes));
  k.resize(kKindBytes, '\0');
  out += k;
  AppendU64(&out, payload.size());
  AppendU64(&out, Fnv1a64(payload));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::string> UnsealRecord(absl::string_view kind, absl::string_view data, const std::string& path) {
  if (data.size() < kHeaderBytes || data.substr(0, kMagic.size()) != kMagic) {
    return absl::DataLossError(absl::StrCat(path, " is not a ShardPS record (bad magic or shorter than its header)"));
  }
  std::string k(kind.substr(0, kKindBytes));
  k.resize(kKindBytes, '\0');
  if (data.substr(kMagic.size(), kKindBytes) != k) {
    return absl::DataLossError(absl::StrCat(path, " does not hold a '", kind, "' record"));
  }
  const uint64_t length = ReadU64(data.data() + 8 + kKindBytes);
  const uint64_t sum = ReadU64(data.data() + 16 + kKindBytes);
  if (data.size() - kHeaderBytes != length) {
    return absl::DataLossError(absl::StrCat(path, " is truncated or torn: header says ", length,
                                            " payload bytes, file holds ", data.size() - kHeaderBytes));
  }
  absl::string_view payload = data.substr(kHeaderBytes);
  if (Fnv1a64(payload) != sum) return absl::DataLossError(absl::StrCat(path, " fails its checksum (corrupt)"));
  return std::string(payload);
}

}  // namespace shardps
