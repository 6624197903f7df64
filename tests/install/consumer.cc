// A C++ job built against an installed ShardPS with find_package(ShardPS)
// (tests/install/CMakeLists.txt). Same step as consumer.c, which runs as the
// other worker of the same job: both pull w - 0.5 * 1.5.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardps/c_api.h"

namespace {

struct DestroyWorker {
  void operator()(shardps_worker* w) const { shardps_worker_destroy(w); }
};
using WorkerPtr = std::unique_ptr<shardps_worker, DestroyWorker>;

char err[512];

void Check(int rc, const char* what) {
  if (rc != SHARDPS_OK) throw std::runtime_error(std::string(what) + ": " + shardps_status_name(rc) + ": " + err);
}

void Step(const char* scheduler, uint32_t rank) {
  shardps_worker* raw = nullptr;
  Check(shardps_worker_create(scheduler, rank, 30.0, &raw, err, sizeof err), "create");
  WorkerPtr w(raw);
  const std::vector<int64_t> shape = {2, 2};
  Check(shardps_declare_tensor(w.get(), "w", shape.data(), shape.size(), err, sizeof err), "declare");
  Check(shardps_define_done(w.get(), err, sizeof err), "define_done");
  const std::vector<float> init = {1, 2, 3, 4};
  if (rank == 0) Check(shardps_init_tensor(w.get(), "w", init.data(), 4, 30.0, err, sizeof err), "init");
  Check(shardps_barrier(w.get(), "init", err, sizeof err), "barrier");
  std::vector<float> grad(4, static_cast<float>(rank + 1)), out(4);
  uint64_t h = 0;
  Check(shardps_push_pull(w.get(), "w", grad.data(), out.data(), 4, &h, err, sizeof err), "push_pull");
  Check(shardps_wait(w.get(), h, 30.0, err, sizeof err), "wait");
  for (size_t i = 0; i < 4; ++i) {
    if (out[i] != init[i] - 0.75f) {
      throw std::runtime_error("w[" + std::to_string(i) + "] = " + std::to_string(out[i]));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SCHEDULER_ADDRESS RANK\n", argv[0]);
    return 2;
  }
  std::printf("c++ consumer: rank %s, libshardps %s\n", argv[2], shardps_version());
  try {
    Step(argv[1], static_cast<uint32_t>(std::atoi(argv[2])));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "c++ consumer: %s\n", e.what());
    return 1;
  }
  std::printf("c++ consumer: ok\n");
  return 0;
}
