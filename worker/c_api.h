/* Stable C ABI over the worker library, for jobs in other languages (Python
 * via ctypes/cffi, PyTorch extensions). Opaque handles; every call that can
 * fail returns a status code (SHARDPS_OK = 0, otherwise one of the shardps_status values,
 * which equal absl::StatusCode) and, on error, fills a caller-provided
 * message buffer when one is given.
 * Same contracts as worker/worker.h: buffers stay valid and unmodified until
 * the matching shardps_wait (or the shardps_wait_any that completes it)
 * returns, whatever it returns (but SHARDPS_ABORTED: another thread waits
 * on it, and that wait is the one); then nothing reads or writes them, a
 * timed-out request included. Every request is waited on once.
 * No C++ exception leaves these functions: one raised inside the library
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

/* `scheduler_address`: "host:port", or "host:port,host:port,..." for schedulers
 * on etcd (one active, the others standbys). Error reporting: `err` may be
 * NULL; otherwise up to err_len-1 bytes of the
 * message are written, NUL-terminated. */
int shardps_worker_create(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                          shardps_worker** out, char* err, size_t err_len);
/* The same, reaching a secured cluster (README "Security"): the `security { }`
 * block of the config file at `security_config` (its token, CA and, for
 * mutual TLS, this node's certificate). NULL or "": plain, as
 * shardps_worker_create. */
int shardps_worker_create_secure(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                                 const char* security_config, shardps_worker** out, char* err, size_t err_len);
/* Leaves the job and frees the worker. NULL, or a worker already destroyed:
 * nothing happens. A call another thread is inside meanwhile runs to its end
 * (a wait until its answer or timeout), and the worker is freed when the last
 * such call returns. Any later call with the destroyed pointer returns
 * SHARDPS_INVALID_ARGUMENT ("not a live worker"), as does one with a pointer
 * shardps_worker_create never returned; the one exception is a pointer that a
 * later shardps_worker_create returned again, which is then that new worker.
 * In a process forked after shardps_worker_create, every call with the
 * parent's worker returns SHARDPS_FAILED_PRECONDITION (its threads and
 * connections stayed in the parent), and destroy leaves it alone. */
void shardps_worker_destroy(shardps_worker* w);
/* Says why the training process stops, when it stops on an error (a binding
 * calls it for an uncaught exception): the leave shardps_worker_destroy then
 * sends carries `error`, and the scheduler lists this worker as failed with
 * it (its log and `shardps status`) rather than as left. The job goes on
 * without it as after any leave. `error` is sent as UTF-8 (a byte that is
 * not is replaced by U+FFFD) and at most 4096 bytes of it are kept; the
 * last call counts; "" takes it back. */
int shardps_fail(shardps_worker* w, const char* error, char* err, size_t err_len);

/* Declares one float32 tensor; call for each tensor, then shardps_define_done.
 * Names (of tensors, barriers) and codec specs are UTF-8 of at most 4096
 * bytes: another is refused with SHARDPS_INVALID_ARGUMENT naming the byte
 * that breaks it, and nothing is declared. */
int shardps_declare_tensor(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, char* err,
                           size_t err_len);
/* Defines the declared tensors (the same list on every worker). A failed call
   changes nothing on the cluster: call it again (e.g. after a timeout), or
   shardps_reset_declared and declare again (e.g. after a refused shape). Once it
   succeeded, later calls with the same list succeed and change nothing. */
int shardps_define_done(shardps_worker* w, char* err, size_t err_len);
/* Element types of a tensor's buffers. Values cross the network as float32 (or
   the configured codec); float16 and bfloat16 buffers are converted on the way,
   rounding to nearest even, so mixed-precision jobs keep 16-bit gradients. */
enum { SHARDPS_FLOAT32 = 1, SHARDPS_FLOAT16 = 2, SHARDPS_BFLOAT16 = 3 };

/* shardps_declare_tensor with the dtype of the buffers the job will pass for
   it (shardps_push_pull_typed); shardps_declare_tensor declares float32. */
int shardps_declare_tensor_dtype(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, int dtype,
                                 char* err, size_t err_len);
/* shardps_declare_tensor_dtype with the codec of this tensor's pushed
   gradients: a codec spec as in the config's compression.codec ("none",
   "fp16", "bf16", "2bit:threshold=0.5", "onebit", "topk:ratio=0.01", ...).
   NULL or "": the config's codec for it. It overrides the config's
   compression.tensor_codecs and compression.codec for this tensor, on the
   workers and the servers alike; a codec the cluster cannot use (unknown
   name, bad parameter, not allowed with this config) makes
   shardps_define_done fail with SHARDPS_INVALID_ARGUMENT naming the tensor. */
int shardps_declare_tensor_codec(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, int dtype,
                                 const char* codec, char* err, size_t err_len);
/* shardps_push_pull with buffers of `bytes` bytes of the tensor's declared
   dtype, which `dtype` must name: another dtype or size is refused
   (SHARDPS_INVALID_ARGUMENT, saying which). Both buffers are borrowed until
   shardps_wait returns for the handle; 16-bit weights are written when it
   returns SHARDPS_OK. */
int shardps_push_pull_typed(shardps_worker* w, const char* name, const void* grad, void* weights, size_t bytes,
                            int dtype, uint64_t* handle, char* err, size_t err_len);

/* shardps_push_pull_typed for buffers in CUDA device memory (e.g. a PyTorch
   CUDA tensor's data_ptr()), `bytes` bytes each of the declared dtype.
   `stream` is the cudaStream_t the tensors are used on (e.g.
   torch.cuda.current_stream().cuda_stream; NULL = the legacy default
   stream). The call copies the gradient and the current weights into pinned
   host memory after the work queued on `stream` and starts the request; the
   shardps_wait that returns SHARDPS_OK has copied the new weights back to
   `weights` in `stream`'s order. SHARDPS_UNIMPLEMENTED when the library was
   built without CUDA; SHARDPS_INVALID_ARGUMENT when a pointer is not device
   memory. */
int shardps_push_pull_cuda(shardps_worker* w, const char* name, const void* grad, void* weights, size_t bytes,
                           int dtype, void* stream, uint64_t* handle, char* err, size_t err_len);

/* Forgets the tensors declared so far (not the cluster's definition). */
int shardps_reset_declared(shardps_worker* w, char* err, size_t err_len);
/* shardps_define_done and shardps_barrier with a deadline of their own
   (seconds > 0; the calls without it wait the config's rendezvous_timeout_ms).
   On timeout: SHARDPS_DEADLINE_EXCEEDED, naming what was missing. */
int shardps_define_done_timeout(shardps_worker* w, double timeout_s, char* err, size_t err_len);
int shardps_barrier_timeout(shardps_worker* w, const char* name, double timeout_s, char* err, size_t err_len);

int shardps_init_tensor(shardps_worker* w, const char* name, const float* values, size_t n, double timeout_s,
                        char* err, size_t err_len);
int shardps_barrier(shardps_worker* w, const char* name, char* err, size_t err_len);

int shardps_push(shardps_worker* w, const char* name, const float* grad, size_t n, uint64_t* handle, char* err,
                 size_t err_len);
int shardps_pull(shardps_worker* w, const char* name, float* weights, size_t n, uint64_t* handle, char* err,
                 size_t err_len);
int shardps_push_pull(shardps_worker* w, const char* name, const float* grad, float* weights, size_t n,
                      uint64_t* handle, char* err, size_t err_len);
/* Takes this worker's part in its next round of `name` without a gradient
 * (a frozen parameter), so the tensor's rounds keep pace with the rest of the
 * model's (sync checkpoints, a rejoin). A round no worker pushed a gradient
 * to completes with no optimizer step; in one others pushed to, this worker
 * counts as a zero. Wait on the handle as on shardps_push's.
 * SHARDPS_FAILED_PRECONDITION where no round waits for pushes (async, ssp
 * applied on arrival: push nothing for a frozen parameter there) and with
 * sum-only 1-bit Adam on a compressed tensor. */
int shardps_skip_round(shardps_worker* w, const char* name, uint64_t* handle, char* err, size_t err_len);
int shardps_wait(shardps_worker* w, uint64_t handle, double timeout_s, char* err, size_t err_len);
/* Waits until one of the n handles completes, so one thread can complete
 * many requests in the order they finish. *done_index is set to the index of
 * the handle that completed, which is then consumed exactly as by
 * shardps_wait (waiting on it again is SHARDPS_INVALID_ARGUMENT), and the
 * call returns that request's status. When none completes within timeout_s,
 * *done_index is n, the call returns SHARDPS_DEADLINE_EXCEEDED and every
 * handle stays outstanding; timeout_s 0 polls (answers already received are
 * taken, then it returns at once). An unknown or already consumed handle:
 * SHARDPS_INVALID_ARGUMENT with *done_index n, nothing consumed. A handle
 * another thread is waiting on (here or in shardps_wait): SHARDPS_ABORTED,
 * nothing consumed; that thread completes it. */
int shardps_wait_any(shardps_worker* w, const uint64_t* handles, size_t n, double timeout_s, size_t* done_index,
                     char* err, size_t err_len);

/* Sum-only mode (update_mode SUM_ONLY) for a job that steps its own
 * optimizer: pushes `grad` and, once shardps_wait returns SHARDPS_OK, has
 * written the round's gradient averaged over the workers into `mean_grad`
 * (n float32 each; both borrowed until then, and distinct buffers). No
 * weights are touched. SHARDPS_FAILED_PRECONDITION in update_mode
 * UPDATE_ON_SERVER. */
int shardps_push_pull_mean_gradient(shardps_worker* w, const char* name, const float* grad, float* mean_grad, size_t n,
                                    uint64_t* handle, char* err, size_t err_len);

/* Push-pull of one partition of `name` (see shardps_partitions): `grad` and
 * `weights` hold that partition's n elements. Lets a caller put partition k
 * on the wire while it still produces k+1. */
int shardps_push_pull_partition(shardps_worker* w, const char* name, size_t index, const float* grad,
                                float* weights, size_t n, uint64_t* handle, char* err, size_t err_len);

/* ---- Queries: what the scheduler handed this worker at registration. ---- */

/* ClusterConfig's values (proto/config.proto). */
enum shardps_consistency { SHARDPS_CONSISTENCY_SYNC = 1, SHARDPS_CONSISTENCY_ASYNC = 2, SHARDPS_CONSISTENCY_SSP = 3 };
enum shardps_update_mode { SHARDPS_UPDATE_ON_SERVER = 0, SHARDPS_UPDATE_SUM_ONLY = 1 };

int shardps_rank(const shardps_worker* w, uint32_t* rank, char* err, size_t err_len);
/* The number of workers in the job. */
int shardps_world_size(const shardps_worker* w, uint32_t* size, char* err, size_t err_len);
/* The servers in the job as this worker last saw it: those its newest shard
 * map lists as live (neither declared dead nor left). A server that joined
 * the running job as one more counts once a map listing it reached the
 * worker, whether it holds partitions yet or not; one that took a dead one's
 * place counts instead of it. Before the tensors are defined (no map yet):
 * the config's num_servers, the count the first map waits for. */
int shardps_num_servers(const shardps_worker* w, uint32_t* servers, char* err, size_t err_len);
int shardps_consistency(const shardps_worker* w, int* consistency, char* err, size_t err_len);
int shardps_update_mode(const shardps_worker* w, int* update_mode, char* err, size_t err_len);
/* The first round of a worker whose rank had been removed from the running
 * job (declared dead, or left) and that registered again: its rounds start
 * there and its first pull returns the job's current weights. 0: it joined
 * at the start. A rejoined worker must not write initial weights or wait at
 * a barrier the job passed before it came back. */
int shardps_rejoin_round(const shardps_worker* w, uint64_t* round, char* err, size_t err_len);
/* Sets *passed to 1 when the job had passed the barrier `name` before this
 * worker rejoined it, else 0 (always 0 for a worker there from the start).
 * Barriers are reusable: entering such a barrier again would wait for every
 * other worker to enter it once more. */
int shardps_rejoin_passed_barrier(const shardps_worker* w, const char* name, int* passed, char* err, size_t err_len);

/* The cluster configuration as protobuf text (proto/config.proto), NUL-
 * terminated. *needed is set to its size including the NUL; when out_len is
 * smaller (out may then be NULL), nothing is written and SHARDPS_OUT_OF_RANGE
 * is returned: call again with *needed bytes. */
int shardps_config_text(const shardps_worker* w, char* out, size_t out_len, size_t* needed, char* err,
                        size_t err_len);

/* One field of the cluster configuration by its path, as `--set` names it
 * ("optimizer.freeze_variance_after", "consistency"): a scalar as text (an
 * unset field reads as its default; enums by name, strings as they are), a
 * message as protobuf text, compression.tensor_codecs as "name=spec" lines
 * sorted by name, another repeated field one element a line. Buffer sizing as shardps_config_text; an unknown path is
 * SHARDPS_INVALID_ARGUMENT naming the fields that exist there. */
int shardps_config_field(const shardps_worker* w, const char* field, char* out, size_t out_len, size_t* needed,
                         char* err, size_t err_len);

typedef struct shardps_partition {
  uint64_t offset;       /* first element of the partition within the tensor */
  uint64_t num_elements;
  uint32_t server;       /* index of the server that owns it */
} shardps_partition;

/* The partitions of `name` in shard-map order. REQUIRES: shardps_define_done
 * succeeded. *count is set to their number; when capacity is smaller (out may
 * then be NULL), nothing is written and SHARDPS_OUT_OF_RANGE is returned. */
int shardps_partitions(const shardps_worker* w, const char* name, shardps_partition* out, size_t capacity,
                       size_t* count, char* err, size_t err_len);

typedef struct shardps_worker_stats {
  uint64_t bytes_pushed; /* payload bytes sent (gradients and initial values) */
  uint64_t bytes_pulled; /* payload bytes received (weights) */
  uint64_t requests;     /* data-plane requests sent */
} shardps_worker_stats;

int shardps_stats(const shardps_worker* w, shardps_worker_stats* stats, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* SHARDPS_WORKER_C_API_H_ */
