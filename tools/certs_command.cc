// `shardps certs`: credentials for a test cluster (tools/cluster_credentials.h).
#include <iostream>

#include "absl/strings/str_split.h"
#include "tools/cli_flags.h"
#include "tools/cluster_credentials.h"
#include "tools/commands.h"

namespace shardps {

int CertsCommand(const Args& args) {
  std::string out, hosts;
  bool mutual = true;
  CliFlags flags("certs");
  flags.String("out", &out, "directory to write the CA, certificates, keys, token and config files into");
  flags.String("hosts", &hosts, "comma-separated host names or IPs of the scheduler (localhost, 127.0.0.1 always)");
  flags.Bool("mutual", &mutual, "require node certificates (mutual TLS); --mutual=false: token and server TLS only");
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::cerr << "shardps certs: " << s.message() << "\n";
    return 2;
  }
  if (flags.help()) return 0;
  if (out.empty()) {
    std::cerr << "shardps certs: --out is required\n";
    return 2;
  }
  std::vector<std::string> host_list;
  if (!hosts.empty()) host_list = absl::StrSplit(hosts, ',');
  auto files = WriteClusterCredentials(out, host_list, mutual);
  if (!files.ok()) {
    std::cerr << "shardps certs: " << files.status().message() << "\n";
    return 1;
  }
  std::cout << "scheduler: shardps scheduler --security-config " << files->scheduler_config << " ...\n"
            << "others:    --security-config " << files->node_config
            << " (servers, workers, status, checkpoint, drain; copy ca.pem, node.pem, node.key, token and node.conf to the "
               "same paths on their hosts, never ca.key)\n";
  return 0;
}

}  // namespace shardps
