/* Stable C ABI over the worker library, for jobs in other languages (Python
 * via ctypes/cffi, PyTorch extensions). Opaque handles; every call returns a
 * status code (SHARDPS_OK = 0, otherwise one of the shardps_status values,
 * which equal absl::StatusCode) and, on error, fills a caller-provided
 * message buffer when one is given.
 * Same contracts as worker/worker.h: buffers stay valid until the matching
 * shardps_wait returns, and every request is waited on once.
 * No C++ exception leaves these functions: one that escapes the library
 * (std::bad_alloc, a ZeroMQ error) is returned as SHARDPS_INTERNAL with its
 * message.
 * Installed as "shardps/c_api.h"; the shared library libshardps exports
 * exactly the functions declared here. */
#ifndef SHARDPS_WORKER_C_API_H_
#define SHARDPS_WORKER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shardps_worker shardps_worker;

/* Status codes returned by every call; the values are absl::StatusCode's. */
enum shardps_status {
  SHARDPS_OK = 0,
  SHARDPS_CANCELLED = 1,
  SHARDPS_UNKNOWN = 2,
  SHARDPS_INVALID_ARGUMENT = 3,
  SHARDPS_DEADLINE_EXCEEDED = 4,
  SHARDPS_NOT_FOUND = 5,
  SHARDPS_ALREADY_EXISTS = 6,
  SHARDPS_PERMISSION_DENIED = 7,
  SHARDPS_RESOURCE_EXHAUSTED = 8,
  SHARDPS_FAILED_PRECONDITION = 9,
  SHARDPS_ABORTED = 10,
  SHARDPS_OUT_OF_RANGE = 11,
  SHARDPS_UNIMPLEMENTED = 12,
  SHARDPS_INTERNAL = 13,
  SHARDPS_UNAVAILABLE = 14,
  SHARDPS_DATA_LOSS = 15,
  SHARDPS_UNAUTHENTICATED = 16
};

/* The library's version, "MAJOR.MINOR.PATCH" (static storage; never NULL). */
const char* shardps_version(void);

/* The name of a status code ("OK", "INVALID_ARGUMENT", ...; static storage),
 * or "UNKNOWN_CODE" for a value that is not a shardps_status. */
const char* shardps_status_name(int code);

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
