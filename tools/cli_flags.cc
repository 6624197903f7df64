#include "tools/cli_flags.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardps {

void CliFlags::String(const std::string& name, std::string* target, const std::string& help) {
  Add(name, Flag{help, false, [target](const std::string& v) {
                   *target = v;
                   return absl::OkStatus();
                 },
                 *target});
}

void CliFlags::Int(const std::string& name, int64_t* target, const std::string& help) {
  Add(name, Flag{help, false, [target, name](const std::string& v) {
                   if (!absl::SimpleAtoi(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not an integer"));
                   }
                   return absl::OkStatus();
                 },
                 std::to_string(*target)});
}

void CliFlags::Count(const std::string& name, int64_t* target, const std::string& help) {
  Int(name, target, help);
  Flag& flag = flags_.at(name);
  flag.set = [parse = std::move(flag.set), target, name](const std::string& v) {
    if (absl::Status s = parse(v); !s.ok()) return s;
    if (*target >= 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", v, " is below 0"));
  };
}

void CliFlags::Double(const std::string& name, double* target, const std::string& help) {
  Add(name, Flag{help, false, [target, name](const std::string& v) {
                   if (!absl::SimpleAtod(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not a number"));
                   }
                   return absl::OkStatus();
                 },
                 absl::StrCat(*target)});
}

void CliFlags::Seconds(const std::string& name, double* target, const std::string& help) {
  Double(name, target, help);
  Flag& flag = flags_.at(name);
  flag.set = [parse = std::move(flag.set), target, name](const std::string& v) {
    if (absl::Status s = parse(v); !s.ok()) return s;
    if (*target >= 0 && *target <= 1e9) return absl::OkStatus();  // NaN fails both
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", v, " is not a number of seconds in [0, 1e9]"));
  };
}

void CliFlags::Bool(const std::string& name, bool* target, const std::string& help) {
  Add(name, Flag{help, true, [target, name](const std::string& v) {
                   if (!absl::SimpleAtob(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not true/false"));
                   }
                   return absl::OkStatus();
                 },
                 *target ? "true" : "false"});
}

void CliFlags::Repeated(const std::string& name, std::vector<std::string>* target, const std::string& help) {
  Add(name, Flag{help + " (repeatable)", false, [target](const std::string& v) {
                   target->push_back(v);
                   return absl::OkStatus();
                 },
                 ""});
}

absl::Status CliFlags::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      std::cout << Usage();
      return absl::OkStatus();
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'\n", Usage()));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "\n", Usage()));
    }
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    if (absl::Status s = it->second.set(value); !s.ok()) return s;
    given_.insert(name);
  }
  return absl::OkStatus();
}

std::string CliFlags::Usage() const {
  std::string out = absl::StrCat("usage: shardps ", command_, " [flags]\n");
  for (const auto& [name, flag] : flags_) {
    absl::StrAppend(&out, "  --", name, flag.is_bool ? "" : " VALUE", "\n      ", flag.help);
    if (!flag.default_value.empty()) absl::StrAppend(&out, " (default: ", flag.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace shardps
