#include "common/names.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace shardps {

size_t Utf8Prefix(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || len > s.size() - i) return i;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (next & 0x3f);
    }
    static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kSmallest[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return i;
}

std::string Counted(uint64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

std::string ToUtf8(absl::string_view s, size_t max_bytes) {
  static constexpr absl::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  while (!s.empty()) {
    const size_t run = Utf8Prefix(s);  // valid bytes, then one that is not (or the end)
    const absl::string_view fits = s.substr(0, Utf8Prefix(s.substr(0, std::min(run, max_bytes - out.size()))));
    absl::StrAppend(&out, fits);
    if (fits.size() < run || run == s.size() || out.size() + kReplacement.size() > max_bytes) break;
    absl::StrAppend(&out, kReplacement);
    s.remove_prefix(run + 1);
  }
  return out;
}

absl::Status CheckName(absl::string_view what, absl::string_view name) {
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", absl::CHexEscape(name.substr(0, 32)), "...' is ",
                                                   name.size(), " bytes long; at most ", kMaxNameBytes));
  }
  const size_t valid = Utf8Prefix(name);
  if (valid < name.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", absl::CHexEscape(name), "' is not UTF-8 (byte ", valid, " breaks it)"));
  }
  return absl::OkStatus();
}

}  // namespace shardps
