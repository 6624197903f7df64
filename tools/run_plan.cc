#include "tools/run_plan.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace shardps {
namespace {

std::optional<std::string> Get(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  // Kubernetes' downward API gives an empty string for a missing label: same as unset.
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool HasFlag(const std::vector<std::string>& args, const std::string& name) {
  const std::string flag = "--" + name;
  for (const std::string& a : args) {
    if (a == flag || absl::StartsWith(a, flag + "=")) return true;
  }
  return false;
}

absl::StatusOr<int64_t> NonNegative(const std::string& name, const std::string& value, int64_t min, int64_t max) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < min || n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", value, " is not an integer in [", min, ", ", max, "]"));
  }
  return n;
}

// "host:port" for gRPC; an IPv6 literal gets brackets.
std::string HostPort(const std::string& host, int64_t port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<int64_t> RootPort(const std::map<std::string, std::string>& env) {
  auto port = Get(env, "DMLC_PS_ROOT_PORT");
  if (!port) return absl::InvalidArgumentError("DMLC_PS_ROOT_PORT is not set (the scheduler's port)");
  return NonNegative("DMLC_PS_ROOT_PORT", *port, 1, 65535);
}

absl::StatusOr<std::string> SchedulerAddress(const std::map<std::string, std::string>& env) {
  auto uri = Get(env, "DMLC_PS_ROOT_URI");
  if (!uri) return absl::InvalidArgumentError("DMLC_PS_ROOT_URI is not set (the scheduler's host)");
  auto port = RootPort(env);
  if (!port.ok()) return port.status();
  return HostPort(*uri, *port);
}

// MX_CONFIG is the JSON the MXJob operator gives every replica:
// {"cluster": ..., "labels": ..., "task": {"type": "worker", "index": N}}.
absl::StatusOr<std::optional<int64_t>> MxConfigIndex(const std::string& json) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(json, &root).ok()) {
    return absl::InvalidArgumentError("MX_CONFIG is not valid JSON");
  }
  auto task = root.fields().find("task");
  if (task == root.fields().end() || !task->second.has_struct_value()) return std::optional<int64_t>();
  const auto& fields = task->second.struct_value().fields();
  auto index = fields.find("index");
  if (index == fields.end() || !index->second.has_number_value()) return std::optional<int64_t>();
  const double v = index->second.number_value();
  if (v < 0 || v > 65535 || v != static_cast<double>(static_cast<int64_t>(v))) {
    return absl::InvalidArgumentError(absl::StrCat("MX_CONFIG task.index ", v, " is not a worker rank"));
  }
  return std::optional<int64_t>(static_cast<int64_t>(v));
}

// The worker's rank: the first of DMLC_WORKER_ID (ps-lite, BytePS),
// JOB_COMPLETION_INDEX (Kubernetes Indexed Job), MX_CONFIG's task.index (MXJob).
absl::StatusOr<int64_t> WorkerRank(const std::map<std::string, std::string>& env) {
  for (const char* name : {"DMLC_WORKER_ID", "JOB_COMPLETION_INDEX"}) {
    if (auto v = Get(env, name)) return NonNegative(name, *v, 0, 65535);
  }
  if (auto json = Get(env, "MX_CONFIG")) {
    auto index = MxConfigIndex(*json);
    if (!index.ok()) return index.status();
    if (*index) return **index;
  }
  return absl::InvalidArgumentError(
      "worker rank unknown: set DMLC_WORKER_ID or JOB_COMPLETION_INDEX, or pass --rank");
}

}  // namespace

const std::vector<std::string>& RunEnvironmentVariables() {
  static const auto* names = new std::vector<std::string>{
      "DMLC_ROLE",      "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",    "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
      "DMLC_WORKER_ID", "DMLC_NODE_HOST",   "JOB_COMPLETION_INDEX", "MX_CONFIG",       "PORT"};
  return *names;
}

absl::StatusOr<RunPlan> PlanRun(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                                const std::string& hostname) {
  RunPlan plan;
  std::optional<std::string> role = Get(env, "DMLC_ROLE");
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--dry-run") {
      plan.dry_run = true;
    } else if (a == "--help" || a == "-h") {
      plan.help = true;
    } else if (a == "--role") {
      if (i + 1 == args.size()) return absl::InvalidArgumentError("--role needs a value: scheduler, server or worker");
      role = args[++i];
    } else if (absl::StartsWith(a, "--role=")) {
      role = a.substr(7);
    } else {
      rest.push_back(a);
    }
  }
  if (plan.help) return plan;
  if (!role) {
    return absl::InvalidArgumentError("no role: set DMLC_ROLE (scheduler, server or worker) or pass --role");
  }
  const std::string r = absl::AsciiStrToLower(*role);
  std::vector<std::string>& out = plan.args;
  if (r == "scheduler") {
    plan.command = "scheduler";
    if (!HasFlag(rest, "listen")) {
      auto port = RootPort(env);
      if (!port.ok()) return port.status();
      out.insert(out.end(), {"--listen", HostPort("0.0.0.0", *port)});
    }
    // Before the caller's own --set flags, which are applied later and so win.
    if (auto n = Get(env, "DMLC_NUM_SERVER")) {
      auto v = NonNegative("DMLC_NUM_SERVER", *n, 1, 1024);
      if (!v.ok()) return v.status();
      out.insert(out.end(), {"--set", absl::StrCat("num_servers=", *v)});
    }
    if (auto n = Get(env, "DMLC_NUM_WORKER")) {
      auto v = NonNegative("DMLC_NUM_WORKER", *n, 1, 65536);
      if (!v.ok()) return v.status();
      out.insert(out.end(), {"--set", absl::StrCat("num_workers=", *v)});
    }
  } else if (r == "server" || r == "worker") {
    plan.command = r == "server" ? "server" : "train";
    if (!HasFlag(rest, "scheduler")) {
      auto address = SchedulerAddress(env);
      if (!address.ok()) return address.status();
      out.insert(out.end(), {"--scheduler", *address});
    }
    if (r == "server") {
      if (!HasFlag(rest, "listen")) {
        int64_t port = 0;  // any free port: the server registers the one it bound
        if (auto p = Get(env, "PORT")) {
          auto v = NonNegative("PORT", *p, 0, 65535);
          if (!v.ok()) return v.status();
          port = *v;
        }
        out.insert(out.end(), {"--listen", absl::StrCat("tcp://*:", port)});
      }
      if (!HasFlag(rest, "advertise-host")) {
        std::string host = Get(env, "DMLC_NODE_HOST").value_or(hostname);
        if (host.empty()) return absl::InvalidArgumentError("no host to advertise: set DMLC_NODE_HOST");
        out.insert(out.end(), {"--advertise-host", host});
      }
    } else if (!HasFlag(rest, "rank")) {
      auto rank = WorkerRank(env);
      if (!rank.ok()) return rank.status();
      out.insert(out.end(), {"--rank", absl::StrCat(*rank)});
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("role '", *role, "' is not one of scheduler, server, worker"));
  }
  out.insert(out.end(), rest.begin(), rest.end());
  return plan;
}

std::string RunUsage() {
  return R"(usage: shardps run [--role scheduler|server|worker] [--dry-run] [flags of that command]

Runs `shardps scheduler`, `server` or `train` with flags taken from the environment
that MXJob (Kubeflow), BytePS and ps-lite launchers set. A flag given here wins over
the variable it would come from; other flags go to the command unchanged.

  DMLC_ROLE             scheduler | server | worker (worker runs `shardps train`)
  DMLC_PS_ROOT_URI      scheduler host         -> server/train --scheduler URI:PORT
  DMLC_PS_ROOT_PORT     scheduler port         -> scheduler --listen 0.0.0.0:PORT
  DMLC_NUM_SERVER       number of servers      -> scheduler --set num_servers=N
  DMLC_NUM_WORKER       number of workers      -> scheduler --set num_workers=N
  DMLC_NODE_HOST        host a server advertises (default: this host's name)
  PORT                  a server's data port (default: any free port)
  DMLC_WORKER_ID, JOB_COMPLETION_INDEX, MX_CONFIG (task.index)
                        a worker's rank, first one set wins

  --dry-run             print the command line and exit
)";
}

}  // namespace shardps
