/* Stable C ABI over the worker library, for jobs in other languages (Python
 * via ctypes/cffi, PyTorch extensions). Opaque handles; every call returns a
 * status code (0 = OK, otherwise an absl::StatusCode value) and, on error,
 * fills a caller-provided message buffer when one is given.
 * Same contracts as worker/worker.h: buffers stay valid until the matching
 * shardps_wait returns, and every request is waited on once. */
#ifndef SHARDPS_WORKER_C_API_H_
#define SHARDPS_WORKER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shardps_worker shardps_worker;

/* Error reporting: `err` may be NULL; otherwise up to err_len-1 bytes of the
 * message are written, NUL-terminated. */
int shardps_worker_create(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                          shardps_worker** out, char* err, size_t err_len);
void shardps_worker_destroy(shardps_worker* w);

/* Declares one float32 tensor; call for each tensor, then shardps_define_done. */
int shardps_declare_tensor(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, char* err,
                           size_t err_len);
int shardps_define_done(shardps_worker* w, char* err, size_t err_len);

int shardps_init_tensor(shardps_worker* w, const char* name, const float* values, size_t n, double timeout_s,
                        char* err, size_t err_len);
int shardps_barrier(shardps_worker* w, const char* name, char* err, size_t err_len);

int shardps_push(shardps_worker* w, const char* name, const float* grad, size_t n, uint64_t* handle, char* err,
                 size_t err_len);
int shardps_pull(shardps_worker* w, const char* name, float* weights, size_t n, uint64_t* handle, char* err,
                 size_t err_len);
int shardps_push_pull(shardps_worker* w, const char* name, const float* grad, float* weights, size_t n,
                      uint64_t* handle, char* err, size_t err_len);
int shardps_wait(shardps_worker* w, uint64_t handle, double timeout_s, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* SHARDPS_WORKER_C_API_H_ */
