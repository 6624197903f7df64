// A small command-line parser for the `shardps` subcommands: `--name value`,
// `--name=value` and bare `--flag` for booleans. Unknown flags, missing or
// malformed values are errors naming the flag. Dashes in names are kept
// (`--devices-per-worker`), as users type them.
#ifndef SHARDPS_TOOLS_CLI_FLAGS_H_
#define SHARDPS_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardps {

class CliFlags {
 public:
  explicit CliFlags(std::string command) : command_(std::move(command)) {}

  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  // An integer of 0 or more (a count or a limit, where 0 often means none).
  void Count(const std::string& name, int64_t* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  // A duration in seconds, 0 or more.
  void Seconds(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  // Repeatable flag: each occurrence appends.
  void Repeated(const std::string& name, std::vector<std::string>* target, const std::string& help);

  // Parses args (without the program and command names).
  absl::Status Parse(const std::vector<std::string>& args);
  // True if Parse() saw --help (usage was printed).
  bool help() const { return help_; }
  // True if Parse() saw --`name` (a default left alone is not given).
  bool given(const std::string& name) const { return given_.contains(name); }
  std::string Usage() const;

 private:
  struct Flag {
    std::string help;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
    std::string default_value;
  };
  void Add(const std::string& name, Flag flag) { flags_[name] = std::move(flag); }

  std::string command_;
  std::map<std::string, Flag> flags_;
  bool help_ = false;
  std::set<std::string> given_;
};

}  // namespace shardps

#endif  // SHARDPS_TOOLS_CLI_FLAGS_H_
