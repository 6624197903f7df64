// partition_engine_bench: the server's own work on a gradient, without
// sockets, next to a memcpy of the same bytes measured in the same run.
//
//   kernels: the server's passes over a round's gradients: the first is only
//     checked (AllFinite) and held, the second summed with it by the pass
//     that checks it (SumAndCheckFinite), later ones checked then added.
//   engine: sync PUSH_PULL rounds of W workers (SGD) through
//     PartitionEngine::Handle, per gradient; the payload's own copy (the
//     receive) is included, as it is in a server.
//
// Usage: partition_engine_bench [--iters N] [--bytes B]. Prints one JSON
// object per figure; times are the median of N repetitions, in microseconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/optimizer.h"
#include "server/partition_engine.h"

namespace shardps {
namespace {

// Median time of `iters` calls of f, in microseconds. The gradients cycle
// through buffers larger than the caches, as received messages would.
template <typename F>
double MedianMicros(int iters, F f) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f(i);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

void Print(const std::string& name, size_t bytes, double us, double memcpy_us) {
  std::cout << absl::StrFormat("{\"figure\": \"%s\", \"bytes\": %d, \"us\": %.1f, \"memcpy_us\": %.1f, "
                               "\"over_memcpy\": %.3f}\n",
                               name, bytes, us, memcpy_us, us / memcpy_us);
}

int Run(int iters, size_t n) {
  constexpr int kBuffers = 16;
  std::vector<std::vector<float>> grads(kBuffers, std::vector<float>(n));
  for (int b = 0; b < kBuffers; ++b) {
    for (size_t i = 0; i < n; ++i) grads[b][i] = 1e-3f * std::sin(static_cast<float>(i + b));
  }
  std::vector<float> sum(n);
  const size_t bytes = n * sizeof(float);
  auto grad = [&](int i) { return grads[i % kBuffers].data(); };
  const double memcpy_us = MedianMicros(iters, [&](int i) { std::memcpy(sum.data(), grad(i), bytes); });
  volatile bool finite = true;
  Print("first gradient: AllFinite", bytes, MedianMicros(iters, [&](int i) { finite = AllFinite(grad(i), n); }),
        memcpy_us);
  Print("later gradients: check then add (two passes)", bytes, MedianMicros(iters, [&](int i) {
          finite = AllFinite(grad(i), n);
          AddInto(sum.data(), grad(i), n);
        }), memcpy_us);
  Print("second gradient: SumAndCheckFinite", bytes, MedianMicros(iters, [&](int i) {
          finite = SumAndCheckFinite(sum.data(), grad(2 * i), grad(2 * i + 1), n);
        }), memcpy_us);
  for (uint32_t workers : {1u, 2u}) {
    ClusterConfig c;
    c.set_num_workers(workers);
    c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    c.mutable_optimizer()->set_learning_rate(1e-3f);
    uint64_t answers = 0;
    auto engine = PartitionEngine::Create(c, [&](const zmq::message_t&, DataHeader& h, zmq::message_t*) {
      if (h.status_code() != 0) std::cerr << "partition_engine_bench: " << h.error() << "\n";
      ++answers;
    });
    if (!engine.ok()) {
      std::cerr << "partition_engine_bench: " << engine.status() << "\n";
      return 1;
    }
    ShardMap map;
    map.set_epoch(1);
    map.add_tensors()->set_name("bench");
    map.add_partitions()->set_num_elements(n);
    if (absl::Status s = (*engine)->InstallShardMap(map, 0); !s.ok()) {
      std::cerr << "partition_engine_bench: " << s << "\n";
      return 1;
    }
    uint64_t round = 0;
    const zmq::message_t peer(std::string("w"));
    const double us = MedianMicros(iters, [&](int i) {
      for (uint32_t w = 0; w < workers; ++w) {
        DataHeader h;
        h.set_op(PUSH_PULL);
        h.set_worker_rank(w);
        h.set_round(round);
        h.set_epoch(1);
        h.set_request_id(round * workers + w + 1);
        h.set_dtype(FLOAT32);
        h.set_num_elements(n);
        zmq::message_t payload(grad(i * workers + w), bytes);
        (*engine)->Handle(peer, h, &payload);
      }
      ++round;
    });
    if (answers != round * workers) {
      std::cerr << "partition_engine_bench: " << answers << " answers for " << round * workers << " requests\n";
      return 1;
    }
    // Per gradient: a round takes W of them.
    Print(absl::StrFormat("engine sync push-pull, %d worker(s), per gradient", workers), bytes, us / workers,
          memcpy_us);
  }
  return 0;
}

}  // namespace
}  // namespace shardps

int main(int argc, char** argv) {
  int iters = 400;
  int64_t bytes = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const bool ok = flag == "--iters"   ? absl::SimpleAtoi(argv[i + 1], &iters) && iters > 0
                    : flag == "--bytes" ? absl::SimpleAtoi(argv[i + 1], &bytes) && bytes >= 4 && bytes % 4 == 0
                                        : false;
    if (!ok) {
      std::cerr << "partition_engine_bench: bad flag " << flag << " " << argv[i + 1]
                << " (--iters N > 0, --bytes B a positive multiple of 4)\n";
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::cerr << "partition_engine_bench: flag " << argv[argc - 1] << " has no value\n";
    return 2;
  }
  return shardps::Run(iters, static_cast<size_t>(bytes / 4));
}
