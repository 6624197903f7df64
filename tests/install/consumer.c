/* A C job built against an installed ShardPS with
 *   cc consumer.c $(pkg-config --cflags --libs shardps)
 * Usage: consumer SCHEDULER_ADDRESS RANK. One sync step of a 2-worker job:
 * rank 0 sets w = {1, 2, 3, 4}, each rank pushes a gradient of rank + 1, and
 * with SGD at learning rate 0.5 both pull w - 0.5 * 1.5. */
#include <stdio.h>
#include <stdlib.h>

#include "shardps/c_api.h"

static char err[512];

#define CHECK(call)                                                                          \
  do {                                                                                       \
    int rc_ = (call);                                                                        \
    if (rc_ != SHARDPS_OK) {                                                                 \
      fprintf(stderr, "c consumer: %s: %s: %s\n", #call, shardps_status_name(rc_), err);     \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SCHEDULER_ADDRESS RANK\n", argv[0]);
    return 2;
  }
  const uint32_t rank = (uint32_t)atoi(argv[2]);
  printf("c consumer: rank %u, libshardps %s\n", rank, shardps_version());

  shardps_worker* w = NULL;
  CHECK(shardps_worker_create(argv[1], rank, 30.0, &w, err, sizeof err));
  uint32_t size = 0;
  CHECK(shardps_world_size(w, &size, err, sizeof err));
  if (size != 2) {
    fprintf(stderr, "c consumer: world size %u, expected 2\n", size);
    return 1;
  }
  const int64_t shape[] = {2, 2};
  CHECK(shardps_declare_tensor(w, "w", shape, 2, err, sizeof err));
  CHECK(shardps_define_done(w, err, sizeof err));
  const float init[4] = {1, 2, 3, 4};
  if (rank == 0) CHECK(shardps_init_tensor(w, "w", init, 4, 30.0, err, sizeof err));
  CHECK(shardps_barrier(w, "init", err, sizeof err));

  float grad[4], out[4];
  for (int i = 0; i < 4; ++i) grad[i] = (float)(rank + 1);
  uint64_t h;
  CHECK(shardps_push_pull(w, "w", grad, out, 4, &h, err, sizeof err));
  CHECK(shardps_wait(w, h, 30.0, err, sizeof err));
  for (int i = 0; i < 4; ++i) {
    if (out[i] != init[i] - 0.75f) {
      fprintf(stderr, "c consumer: w[%d] = %g, expected %g\n", i, out[i], init[i] - 0.75f);
      return 1;
    }
  }
  int rc = shardps_push(w, "w", grad, 3, &h, err, sizeof err);
  if (rc != SHARDPS_INVALID_ARGUMENT) {
    fprintf(stderr, "c consumer: a 3-element push of a 4-element tensor gave %s\n", shardps_status_name(rc));
    return 1;
  }
  shardps_worker_destroy(w);
  printf("c consumer: ok\n");
  return 0;
}
