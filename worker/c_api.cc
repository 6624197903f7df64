#include "worker/c_api.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/names.h"
#include "compression/codec_math.h"
#include "google/protobuf/text_format.h"
#include "glog/logging.h"
#include "worker/cuda_transfer.h"
#include "worker/worker.h"

namespace {

// Forks this process has been the child of (counted by a pthread_atfork
// handler that LiveWorkers installs): a worker made before the last of them
// belongs to another process. A comparison per call, where getpid() would be
// a system call per request.
std::atomic<uint64_t> g_forks{0};
uint64_t ForksSeen() { return g_forks.load(std::memory_order_relaxed); }

}  // namespace

struct shardps_worker {
  // A 16-bit request's float32 staging and where its weights go back.
  struct Staged {
    std::vector<float> grad, weights;
    void* out = nullptr;
    int dtype = SHARDPS_FLOAT32;
    // shardps_push_pull_cuda: the device buffers' bytes (gradient, then
    // weights) in pinned memory, the device weights and the stream to copy
    // them back on.
    std::unique_ptr<shardps::PinnedHostBuffer> pinned;
    size_t bytes = 0;  // Of each device buffer.
    void* device_out = nullptr;
    void* stream = nullptr;
  };
  std::unique_ptr<shardps::Worker> worker;
  // The process that made it, and the forks it had seen (ForksSeen): a
  // forked child shares its sockets' memory but not their threads, so it must
  // not use it.
  pid_t creator = getpid();
  uint64_t forks = ForksSeen();
  absl::Mutex mu;
  std::vector<shardps::TensorSpec> declared ABSL_GUARDED_BY(mu);
  std::map<std::string, std::pair<int, uint64_t>> dtypes ABSL_GUARDED_BY(mu);  // name -> (dtype, elements)
  std::map<uint64_t, std::unique_ptr<Staged>> staged ABSL_GUARDED_BY(mu);
  // Staging of requests whose wait failed: a request may still leave later
  // and read it, so it lives as long as the worker (worker/worker.h).
  std::vector<std::unique_ptr<Staged>> abandoned ABSL_GUARDED_BY(mu);
  // Pinned buffers of finished CUDA requests, reused by later ones.
  std::vector<std::unique_ptr<shardps::PinnedHostBuffer>> pinned_free ABSL_GUARDED_BY(mu);
};

// The header's codes are absl::StatusCode's, so Report can return s.code() as is.
static_assert(SHARDPS_OK == static_cast<int>(absl::StatusCode::kOk));
static_assert(SHARDPS_CANCELLED == static_cast<int>(absl::StatusCode::kCancelled));
static_assert(SHARDPS_UNKNOWN == static_cast<int>(absl::StatusCode::kUnknown));
static_assert(SHARDPS_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(SHARDPS_DEADLINE_EXCEEDED == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
static_assert(SHARDPS_NOT_FOUND == static_cast<int>(absl::StatusCode::kNotFound));
static_assert(SHARDPS_ALREADY_EXISTS == static_cast<int>(absl::StatusCode::kAlreadyExists));
static_assert(SHARDPS_PERMISSION_DENIED == static_cast<int>(absl::StatusCode::kPermissionDenied));
static_assert(SHARDPS_RESOURCE_EXHAUSTED == static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(SHARDPS_FAILED_PRECONDITION == static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(SHARDPS_ABORTED == static_cast<int>(absl::StatusCode::kAborted));
static_assert(SHARDPS_OUT_OF_RANGE == static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(SHARDPS_UNIMPLEMENTED == static_cast<int>(absl::StatusCode::kUnimplemented));
static_assert(SHARDPS_INTERNAL == static_cast<int>(absl::StatusCode::kInternal));
static_assert(SHARDPS_UNAVAILABLE == static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(SHARDPS_DATA_LOSS == static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(SHARDPS_UNAUTHENTICATED == static_cast<int>(absl::StatusCode::kUnauthenticated));
static_assert(SHARDPS_CONSISTENCY_SYNC == static_cast<int>(shardps::SYNC));
static_assert(SHARDPS_CONSISTENCY_ASYNC == static_cast<int>(shardps::ASYNC));
static_assert(SHARDPS_CONSISTENCY_SSP == static_cast<int>(shardps::SSP));
static_assert(SHARDPS_UPDATE_ON_SERVER == static_cast<int>(shardps::UPDATE_ON_SERVER));
static_assert(SHARDPS_UPDATE_SUM_ONLY == static_cast<int>(shardps::SUM_ONLY));

namespace {

// Writes "exception in <entry>: <what>" without allocating, so it also works
// for std::bad_alloc.
int Internal(const char* entry, const char* what, char* err, size_t err_len) noexcept {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "exception in %s: %s", entry, what);
  return SHARDPS_INTERNAL;
}

// The one guard around every C entry point: an exception must not unwind
// through extern "C" frames (it would terminate the host process, e.g. a
// Python interpreter), so it becomes SHARDPS_INTERNAL with its message.
template <typename F>
int Guarded(const char* entry, char* err, size_t err_len, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return Internal(entry, e.what(), err, err_len);
  } catch (...) {
    return Internal(entry, "unknown exception", err, err_len);
  }
}

int Report(const absl::Status& s, char* err, size_t err_len) {
  if (!s.ok() && err != nullptr && err_len > 0) {
    size_t n = std::min(err_len - 1, s.message().size());
    std::memcpy(err, s.message().data(), n);
    err[n] = '\0';
  }
  return static_cast<int>(s.code());
}

absl::Duration Seconds(double s) { return absl::Seconds(s > 0 ? s : 0); }

int Null(const char* what, char* err, size_t err_len) {
  return Report(absl::InvalidArgumentError(std::string(what) + " is NULL"), err, err_len);
}

// A plain mutex that a fork may cross: its lock is one futex word with no
// queue of waiters, so the child can release what the forking thread took,
// whoever else was waiting in the parent. (absl::Mutex hands itself over to
// a queued waiter on release; in the child that thread does not exist.)
class ABSL_LOCKABLE ForkableMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE ForkableLock {
 public:
  explicit ForkableLock(ForkableMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~ForkableLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  ForkableMutex* const mu_;
};

// Every worker shardps_worker_create handed out and shardps_worker_destroy
// has not yet taken back. A call with any other pointer (destroyed already,
// destroyed twice, never created) is refused instead of reading freed
// memory. Each call holds a reference for its duration, so a destroy while
// another thread is inside a call deletes the worker when that call returns.
// Never destroyed: calls may still arrive from other threads at exit.
class LiveWorkers {
 public:
  // The set's lock is held across every fork, so a child never starts with
  // it held by a thread the child does not have: its first call, or its
  // destroy of the parent's worker, would wait for good.
  LiveWorkers() {
    the_ = this;  // for the handlers, which may run before Live() has returned
    pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild);
  }

  void Add(std::shared_ptr<shardps_worker> w) {
    ForkableLock lock(&mu_);
    live_.emplace(w.get(), std::move(w));
  }
  // The worker `w` if it is live, else null.
  std::shared_ptr<shardps_worker> Find(const shardps_worker* w) {
    ForkableLock lock(&mu_);
    auto it = live_.find(w);
    return it == live_.end() ? nullptr : it->second;
  }
  // Takes `w` out of the live set; null if it was not in it.
  std::shared_ptr<shardps_worker> Remove(const shardps_worker* w) {
    ForkableLock lock(&mu_);
    auto it = live_.find(w);
    if (it == live_.end()) return nullptr;
    std::shared_ptr<shardps_worker> removed = std::move(it->second);
    live_.erase(it);
    return removed;
  }

 private:
  static void BeforeFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { the_->mu_.Lock(); }
  static void AfterForkInParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { the_->mu_.Unlock(); }
  static void AfterForkInChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    ++g_forks;
    the_->mu_.Unlock();
  }

  static inline LiveWorkers* the_ = nullptr;
  ForkableMutex mu_;
  std::map<const shardps_worker*, std::shared_ptr<shardps_worker>> live_ ABSL_GUARDED_BY(mu_);
};

bool MadeInAnotherProcess(const shardps_worker& w) { return w.forks != ForksSeen(); }

LiveWorkers& Live() {
  static LiveWorkers* const live = new LiveWorkers;
  return *live;
}

// The guard of every entry point that takes a worker: body(worker) runs with
// the worker held live, or the call is refused naming the pointer.
template <typename F>
int WithWorker(const char* entry, const shardps_worker* w, char* err, size_t err_len, F&& body) noexcept {
  return Guarded(entry, err, err_len, [&] {
    if (w == nullptr) return Null("worker", err, err_len);
    std::shared_ptr<shardps_worker> held = Live().Find(w);
    if (held == nullptr) {
      return Report(absl::InvalidArgumentError(absl::StrCat(
                        entry, ": worker 0x", absl::Hex(reinterpret_cast<uintptr_t>(w)),
                        " is not a live worker (already destroyed, or not made by shardps_worker_create)")),
                    err, err_len);
    }
    if (MadeInAnotherProcess(*held)) {
      return Report(absl::FailedPreconditionError(absl::StrCat(
                        entry, ": the worker was made in process ", held->creator, "; process ", getpid(),
                        ", forked from it, cannot use it (make a worker in the child)")),
                    err, err_len);
    }
    return body(*held);
  });
}

template <typename F>
int StartRequest(uint64_t* handle, char* err, size_t err_len, F start) {
  if (handle == nullptr) return Null("handle", err, err_len);
  absl::StatusOr<uint64_t> h = start();
  if (!h.ok()) return Report(h.status(), err, err_len);
  *handle = *h;
  return 0;
}

// A query entry point: fills *out with get(worker).
template <typename T, typename F>
int Query(const char* entry, const shardps_worker* w, T* out, char* err, size_t err_len, F get) {
  return WithWorker(entry, w, err, err_len, [&](shardps_worker& live) {
    if (out == nullptr) return Null("output", err, err_len);
    *out = get(*live.worker);
    return 0;
  });
}

int TooSmall(const char* what, size_t capacity, size_t needed, char* err, size_t err_len) {
  return Report(absl::OutOfRangeError(absl::StrCat(what, " holds ", capacity, ", needs ", needed)), err, err_len);
}


size_t ElementBytes(int dtype) {
  switch (dtype) {
    case SHARDPS_FLOAT32:
      return 4;
    case SHARDPS_FLOAT16:
    case SHARDPS_BFLOAT16:
      return 2;
  }
  return 0;
}

const char* DtypeName(int dtype) {
  switch (dtype) {
    case SHARDPS_FLOAT32:
      return "float32";
    case SHARDPS_FLOAT16:
      return "float16";
    case SHARDPS_BFLOAT16:
      return "bfloat16";
  }
  return "unknown";
}

absl::Status UnknownDtype(int dtype) {
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", dtype, " is not SHARDPS_FLOAT32, SHARDPS_FLOAT16 or SHARDPS_BFLOAT16"));
}

int Declare(shardps_worker& w, const char* name, const int64_t* shape, size_t ndim, int dtype, const char* codec) {
  shardps::TensorSpec spec;
  spec.set_name(name);
  uint64_t n = 1;
  for (size_t i = 0; i < ndim; ++i) {
    spec.add_shape(shape[i]);
    n *= shape[i] > 0 ? static_cast<uint64_t>(shape[i]) : 0;
  }
  spec.set_dtype(shardps::FLOAT32);  // on the wire; the buffers' dtype stays here
  if (codec != nullptr) spec.set_codec(codec);
  absl::MutexLock lock(&w.mu);
  w.declared.push_back(std::move(spec));
  w.dtypes[name] = {dtype, n};
  return SHARDPS_OK;
}

// What every shardps_declare_tensor* entry point does: checks its arguments, then declares.
int CheckedDeclare(const char* entry, shardps_worker* w, const char* name, const int64_t* shape, size_t ndim,
                   int dtype, const char* codec, char* err, size_t err_len) {
  return WithWorker(entry, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || (shape == nullptr && ndim > 0)) return Null("name or shape", err, err_len);
    if (ElementBytes(dtype) == 0) return Report(UnknownDtype(dtype), err, err_len);
    absl::Status valid = shardps::CheckName("tensor name", name);
    if (valid.ok() && codec != nullptr) valid = shardps::CheckName(absl::StrCat("codec of tensor '", name, "'"), codec);
    if (!valid.ok()) return Report(valid, err, err_len);
    return Declare(live, name, shape, ndim, dtype, codec);
  });
}

// The element count of `name`, once its buffers' dtype and size match.
absl::StatusOr<size_t> CheckTyped(shardps_worker& w, const char* name, size_t bytes, int dtype) {
  if (ElementBytes(dtype) == 0) return UnknownDtype(dtype);
  absl::MutexLock lock(&w.mu);
  auto it = w.dtypes.find(name);
  if (it == w.dtypes.end()) return absl::NotFoundError(absl::StrCat("tensor '", name, "' was not declared here"));
  const auto [declared, n] = it->second;
  if (declared != dtype) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is declared ", DtypeName(declared),
                                                   "; the buffers are ", DtypeName(dtype)));
  }
  if (bytes != n * ElementBytes(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ", n, " ", DtypeName(dtype),
                                                   " elements (", n * ElementBytes(dtype), " bytes); the buffers hold ",
                                                   bytes, " bytes"));
  }
  return static_cast<size_t>(n);
}

std::vector<float> ToFloats(const void* data, size_t n, int dtype) {
  std::vector<float> out(n);
  const auto* h = static_cast<const uint16_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    out[i] = dtype == SHARDPS_FLOAT16 ? shardps::compression::math::HalfToFloat(h[i])
                                      : shardps::compression::math::Bf16ToFloat(h[i]);
  }
  return out;
}

void StoreWeights(const shardps_worker::Staged& s) {
  auto* h = static_cast<uint16_t*>(s.out);
  for (size_t i = 0; i < s.weights.size(); ++i) {
    h[i] = s.dtype == SHARDPS_FLOAT16 ? shardps::compression::math::FloatToHalf(s.weights[i])
                                     : shardps::compression::math::FloatToBf16(s.weights[i]);
  }
}

// A pinned buffer of at least `bytes`, from the free list or new.
absl::StatusOr<std::unique_ptr<shardps::PinnedHostBuffer>> TakePinned(shardps_worker& w, size_t bytes) {
  {
    absl::MutexLock lock(&w.mu);
    for (auto it = w.pinned_free.begin(); it != w.pinned_free.end(); ++it) {
      if ((*it)->size() < bytes) continue;
      auto buffer = std::move(*it);
      w.pinned_free.erase(it);
      return buffer;
    }
  }
  return shardps::PinnedHostBuffer::Create(bytes);
}

// Copies the device gradient and weights (`bytes` each) into pinned staging
// in `stream`'s order; 16-bit dtypes are widened into grad/weights.
absl::StatusOr<std::unique_ptr<shardps_worker::Staged>> StageFromDevice(shardps_worker& w, const void* grad,
                                                                       void* weights, size_t bytes, size_t n,
                                                                       int dtype, void* stream) {
  absl::Status valid = shardps::CheckDeviceMemory(grad, "gradient");
  if (valid.ok()) valid = shardps::CheckDeviceMemory(weights, "weights");
  if (!valid.ok()) return valid;
  auto pinned = TakePinned(w, 2 * bytes);
  if (!pinned.ok()) return pinned.status();
  auto staged = std::make_unique<shardps_worker::Staged>();
  staged->pinned = std::move(*pinned);
  staged->dtype = dtype;
  staged->bytes = bytes;
  staged->device_out = weights;
  staged->stream = stream;
  auto* host = static_cast<uint8_t*>(staged->pinned->data());
  absl::Status s = shardps::CopyFromDevice(host, grad, bytes, stream, "gradient");
  if (s.ok()) s = shardps::CopyFromDevice(host + bytes, weights, bytes, stream, "weights");
  if (!s.ok()) return s;
  if (dtype != SHARDPS_FLOAT32) {
    staged->grad = ToFloats(host, n, dtype);
    staged->weights = ToFloats(host + bytes, n, dtype);  // sum-only and delta pulls update them in place
    staged->out = host + bytes;
  }
  return staged;
}

// The tensors declared so far (a copy: define_done must not hold the lock
// while it waits for the cluster).
std::vector<shardps::TensorSpec> Declared(shardps_worker& w) {
  absl::MutexLock lock(&w.mu);
  return w.declared;
}

// After a successful wait: the new weights to the device (narrowed first for
// 16-bit dtypes); the pinned buffer goes back to the free list.
absl::Status StoreDeviceWeights(shardps_worker& w, shardps_worker::Staged& s) {
  if (s.dtype != SHARDPS_FLOAT32) StoreWeights(s);
  absl::Status status = shardps::CopyToDevice(s.device_out, static_cast<uint8_t*>(s.pinned->data()) + s.bytes,
                                              s.bytes, s.stream, "weights");
  absl::MutexLock lock(&w.mu);
  w.pinned_free.push_back(std::move(s.pinned));
  return status;
}

// After the wait for `handle` returned `s`: a staged request's weights go
// back to the caller's 16-bit or device buffer, or its staging is kept alive
// when the request failed (it may still leave later).
absl::Status Finish(shardps_worker& w, uint64_t handle, absl::Status s) {
  if (absl::IsAborted(s)) return s;  // another thread waits on it and finishes it
  std::unique_ptr<shardps_worker::Staged> staged;
  {
    absl::MutexLock lock(&w.mu);
    auto it = w.staged.find(handle);
    if (it == w.staged.end()) return s;
    staged = std::move(it->second);
    w.staged.erase(it);
  }
  if (s.ok() && staged->pinned != nullptr) return StoreDeviceWeights(w, *staged);
  if (s.ok()) {
    StoreWeights(*staged);
    return s;
  }
  absl::MutexLock lock(&w.mu);
  w.abandoned.push_back(std::move(staged));
  return s;
}

}  // namespace

extern "C" {

int shardps_worker_create(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                          shardps_worker** out, char* err, size_t err_len) {
  return shardps_worker_create_secure(scheduler_address, rank, rendezvous_timeout_s, nullptr, out, err, err_len);
}

int shardps_worker_create_secure(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                                 const char* security_config, shardps_worker** out, char* err, size_t err_len) {
  return Guarded(__func__, err, err_len, [&] {
    if (scheduler_address == nullptr) return Null("scheduler_address", err, err_len);
    if (out == nullptr) return Null("out", err, err_len);
    shardps::WorkerOptions options;
    options.scheduler_address = scheduler_address;
    options.rank = rank;
    options.rendezvous_timeout = Seconds(rendezvous_timeout_s);
    auto security = shardps::LoadSecurityCredentialsFile(security_config == nullptr ? "" : security_config,
                                                         /*for_scheduler=*/false);
    if (!security.ok()) return Report(security.status(), err, err_len);
    options.security = *std::move(security);
    auto worker = shardps::Worker::Create(options);
    if (!worker.ok()) return Report(worker.status(), err, err_len);
    auto created = std::make_shared<shardps_worker>();
    created->worker = *std::move(worker);
    *out = created.get();
    Live().Add(std::move(created));
    return 0;
  });
}

void shardps_worker_destroy(shardps_worker* w) {
  Guarded(__func__, nullptr, 0, [&] {
    if (w == nullptr) return 0;
    // A forked child's copy is left alone: its destructor would stop threads
    // the child does not have and close the parent's connections.
    if (std::shared_ptr<shardps_worker> held = Live().Find(w); held != nullptr && MadeInAnotherProcess(*held)) return 0;
    // Deleted here, or when the last call another thread is inside returns.
    if (Live().Remove(w) == nullptr) {
      LOG(WARNING) << "shardps_worker_destroy: worker " << w
                   << " is not a live worker (destroyed twice, or not made by shardps_worker_create); ignored";
    }
    return 0;
  });
}

const char* shardps_version(void) { return SHARDPS_VERSION_STRING; }

const char* shardps_status_name(int code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "UNKNOWN_CODE";
  return kNames[code];
}

int shardps_declare_tensor(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, char* err,
                           size_t err_len) {
  return CheckedDeclare(__func__, w, name, shape, ndim, SHARDPS_FLOAT32, nullptr, err, err_len);
}

int shardps_declare_tensor_dtype(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, int dtype,
                                 char* err, size_t err_len) {
  return CheckedDeclare(__func__, w, name, shape, ndim, dtype, nullptr, err, err_len);
}

int shardps_declare_tensor_codec(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, int dtype,
                                 const char* codec, char* err, size_t err_len) {
  return CheckedDeclare(__func__, w, name, shape, ndim, dtype, codec, err, err_len);
}

int shardps_fail(shardps_worker* w, const char* error, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (error == nullptr) return Null("error", err, err_len);
    live.worker->SetLeavingError(error);
    return 0;
  });
}

int shardps_define_done(shardps_worker* w, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    return Report(live.worker->DefineTensors(Declared(live)), err, err_len);
  });
}

int shardps_define_done_timeout(shardps_worker* w, double timeout_s, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (!(timeout_s > 0)) return Report(absl::InvalidArgumentError("timeout must be > 0 seconds"), err, err_len);
    return Report(live.worker->DefineTensors(Declared(live), Seconds(timeout_s)), err, err_len);
  });
}

int shardps_barrier_timeout(shardps_worker* w, const char* name, double timeout_s, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr) return Null("name", err, err_len);
    if (!(timeout_s > 0)) return Report(absl::InvalidArgumentError("timeout must be > 0 seconds"), err, err_len);
    return Report(live.worker->Barrier(name, nullptr, Seconds(timeout_s)), err, err_len);
  });
}

int shardps_reset_declared(shardps_worker* w, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    absl::MutexLock lock(&live.mu);
    live.declared.clear();
    return 0;
  });
}

int shardps_init_tensor(shardps_worker* w, const char* name, const float* values, size_t n, double timeout_s, char* err,
                        size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || values == nullptr) return Null("name or values", err, err_len);
    return Report(live.worker->InitTensor(name, absl::MakeConstSpan(values, n), Seconds(timeout_s)), err, err_len);
  });
}

int shardps_barrier(shardps_worker* w, const char* name, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr) return Null("name", err, err_len);
    return Report(live.worker->Barrier(name), err, err_len);
  });
}

int shardps_push(shardps_worker* w, const char* name, const float* grad, size_t n, uint64_t* handle, char* err,
                 size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr) return Null("name or grad", err, err_len);
    return StartRequest(handle, err, err_len, [&] { return live.worker->Push(name, absl::MakeConstSpan(grad, n)); });
  });
}

int shardps_skip_round(shardps_worker* w, const char* name, uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr) return Null("name", err, err_len);
    return StartRequest(handle, err, err_len, [&] { return live.worker->SkipRound(name); });
  });
}

int shardps_pull(shardps_worker* w, const char* name, float* weights, size_t n, uint64_t* handle, char* err,
                 size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || weights == nullptr) return Null("name or weights", err, err_len);
    return StartRequest(handle, err, err_len, [&] { return live.worker->Pull(name, absl::MakeSpan(weights, n)); });
  });
}

int shardps_push_pull(shardps_worker* w, const char* name, const float* grad, float* weights, size_t n,
                      uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr || weights == nullptr) return Null("name, grad or weights", err, err_len);
    return StartRequest(handle, err, err_len, [&] {
      return live.worker->PushPull(name, absl::MakeConstSpan(grad, n), absl::MakeSpan(weights, n));
    });
  });
}

int shardps_push_pull_mean_gradient(shardps_worker* w, const char* name, const float* grad, float* mean_grad, size_t n,
                                    uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr || mean_grad == nullptr) {
      return Null("name, grad or mean_grad", err, err_len);
    }
    return StartRequest(handle, err, err_len, [&] {
      return live.worker->PushPullMeanGradient(name, absl::MakeConstSpan(grad, n), absl::MakeSpan(mean_grad, n));
    });
  });
}

int shardps_wait(shardps_worker* w, uint64_t handle, double timeout_s, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    return Report(Finish(live, handle, live.worker->Wait(handle, Seconds(timeout_s))), err, err_len);
  });
}

int shardps_wait_any(shardps_worker* w, const uint64_t* handles, size_t n, double timeout_s, size_t* done_index,
                     char* err, size_t err_len) {
  if (done_index != nullptr) *done_index = n;
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (done_index == nullptr) return Null("done_index", err, err_len);
    if (handles == nullptr && n > 0) return Null("handles", err, err_len);
    if (n == 0) return Report(absl::InvalidArgumentError("shardps_wait_any: no handles"), err, err_len);
    absl::Status status;
    absl::StatusOr<size_t> done =
        live.worker->WaitAny(absl::MakeConstSpan(handles, n), Seconds(timeout_s), &status);
    if (!done.ok()) return Report(done.status(), err, err_len);
    *done_index = *done;
    return Report(Finish(live, handles[*done], status), err, err_len);
  });
}

int shardps_push_pull_typed(shardps_worker* w, const char* name, const void* grad, void* weights, size_t bytes,
                            int dtype, uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr || weights == nullptr || handle == nullptr) {
      return Null("name, grad, weights or handle", err, err_len);
    }
    auto n = CheckTyped(live, name, bytes, dtype);
    if (!n.ok()) return Report(n.status(), err, err_len);
    if (dtype == SHARDPS_FLOAT32) {
      return StartRequest(handle, err, err_len, [&] {
        return live.worker->PushPull(name, absl::MakeConstSpan(static_cast<const float*>(grad), *n),
                                   absl::MakeSpan(static_cast<float*>(weights), *n));
      });
    }
    auto staged = std::make_unique<shardps_worker::Staged>();
    staged->out = weights;
    staged->dtype = dtype;
    staged->grad = ToFloats(grad, *n, dtype);
    staged->weights = ToFloats(weights, *n, dtype);  // sum-only and delta pulls update them in place
    const int rc = StartRequest(handle, err, err_len, [&] {
      return live.worker->PushPull(name, staged->grad, absl::MakeSpan(staged->weights));
    });
    if (rc == SHARDPS_OK) {
      absl::MutexLock lock(&live.mu);
      live.staged[*handle] = std::move(staged);
    }
    return rc;
  });
}

int shardps_push_pull_cuda(shardps_worker* w, const char* name, const void* grad, void* weights, size_t bytes,
                           int dtype, void* stream, uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr || weights == nullptr || handle == nullptr) {
      return Null("name, grad, weights or handle", err, err_len);
    }
    if (!shardps::CudaTransfersBuilt()) {
      return Report(absl::UnimplementedError("shardps_push_pull_cuda: this libshardps was built without CUDA; "
                                             "copy the tensors to the host and use shardps_push_pull_typed"),
                    err, err_len);
    }
    auto n = CheckTyped(live, name, bytes, dtype);
    if (!n.ok()) return Report(n.status(), err, err_len);
    auto staged = StageFromDevice(live, grad, weights, bytes, *n, dtype, stream);
    if (!staged.ok()) return Report(staged.status(), err, err_len);
    shardps_worker::Staged& s = **staged;
    auto* host = static_cast<float*>(s.pinned->data());
    const bool wide = dtype == SHARDPS_FLOAT32;  // pushed from and pulled into the pinned bytes
    const int rc = StartRequest(handle, err, err_len, [&] {
      return live.worker->PushPull(name, wide ? absl::MakeConstSpan(host, *n) : absl::MakeConstSpan(s.grad),
                                 wide ? absl::MakeSpan(host + *n, *n) : absl::MakeSpan(s.weights));
    });
    absl::MutexLock lock(&live.mu);
    if (rc == SHARDPS_OK) {
      live.staged[*handle] = std::move(*staged);
    } else {
      live.pinned_free.push_back(std::move(s.pinned));
    }
    return rc;
  });
}

int shardps_push_pull_partition(shardps_worker* w, const char* name, size_t index, const float* grad, float* weights,
                                size_t n, uint64_t* handle, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || grad == nullptr || weights == nullptr) return Null("name, grad or weights", err, err_len);
    return StartRequest(handle, err, err_len, [&] {
      return live.worker->PushPullPartition(name, index, absl::MakeConstSpan(grad, n), absl::MakeSpan(weights, n));
    });
  });
}

int shardps_rank(const shardps_worker* w, uint32_t* rank, char* err, size_t err_len) {
  return Query(__func__, w, rank, err, err_len, [](const shardps::Worker& x) { return x.rank(); });
}

int shardps_world_size(const shardps_worker* w, uint32_t* size, char* err, size_t err_len) {
  return Query(__func__, w, size, err, err_len, [](const shardps::Worker& x) { return x.config().num_workers(); });
}

int shardps_num_servers(const shardps_worker* w, uint32_t* servers, char* err, size_t err_len) {
  return Query(__func__, w, servers, err, err_len, [](const shardps::Worker& x) { return x.num_servers(); });
}

int shardps_consistency(const shardps_worker* w, int* consistency, char* err, size_t err_len) {
  return Query(__func__, w, consistency, err, err_len,
               [](const shardps::Worker& x) { return static_cast<int>(x.config().consistency()); });
}

int shardps_update_mode(const shardps_worker* w, int* update_mode, char* err, size_t err_len) {
  return Query(__func__, w, update_mode, err, err_len,
               [](const shardps::Worker& x) { return static_cast<int>(x.config().update_mode()); });
}

int shardps_rejoin_round(const shardps_worker* w, uint64_t* round, char* err, size_t err_len) {
  return Query(__func__, w, round, err, err_len, [](const shardps::Worker& x) { return x.rejoin().round; });
}

int shardps_rejoin_passed_barrier(const shardps_worker* w, const char* name, int* passed, char* err, size_t err_len) {
  if (name == nullptr) return Null("name", err, err_len);
  return Query(__func__, w, passed, err, err_len, [name](const shardps::Worker& x) {
    return x.rejoin().passed_barriers.contains(name) ? 1 : 0;
  });
}

namespace {

// Copies `text` and its NUL into out, or says how many bytes it needs.
int CopyOut(const std::string& text, const char* what, char* out, size_t out_len, size_t* needed, char* err,
            size_t err_len) {
  *needed = text.size() + 1;
  if (out_len < *needed) return TooSmall(what, out_len, *needed, err, err_len);
  if (out == nullptr) return Null("out", err, err_len);
  std::memcpy(out, text.c_str(), *needed);
  return 0;
}

}  // namespace

int shardps_config_text(const shardps_worker* w, char* out, size_t out_len, size_t* needed, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (needed == nullptr) return Null("needed", err, err_len);
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(live.worker->config(), &text)) {
      return Report(absl::InternalError("cannot print the cluster config"), err, err_len);
    }
    return CopyOut(text, "config buffer", out, out_len, needed, err, err_len);
  });
}

int shardps_config_field(const shardps_worker* w, const char* field, char* out, size_t out_len, size_t* needed,
                         char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (field == nullptr || needed == nullptr) return Null("field or needed", err, err_len);
    auto value = shardps::GetConfigField(live.worker->config(), field);
    if (!value.ok()) return Report(value.status(), err, err_len);
    return CopyOut(*value, "config field buffer", out, out_len, needed, err, err_len);
  });
}

int shardps_partitions(const shardps_worker* w, const char* name, shardps_partition* out, size_t capacity,
                       size_t* count, char* err, size_t err_len) {
  return WithWorker(__func__, w, err, err_len, [&](shardps_worker& live) {
    if (name == nullptr || count == nullptr) return Null("name or count", err, err_len);
    auto partitions = live.worker->Partitions(name);
    if (!partitions.ok()) return Report(partitions.status(), err, err_len);
    *count = partitions->size();
    if (capacity < *count) return TooSmall("partition array", capacity, *count, err, err_len);
    if (out == nullptr && *count > 0) return Null("out", err, err_len);
    for (size_t i = 0; i < *count; ++i) {
      const auto& p = (*partitions)[i];
      out[i] = shardps_partition{p.offset, p.num_elements, p.server};
    }
    return 0;
  });
}

int shardps_stats(const shardps_worker* w, shardps_worker_stats* stats, char* err, size_t err_len) {
  return Query(__func__, w, stats, err, err_len, [](const shardps::Worker& x) {
    const shardps::WorkerStats s = x.stats();
    return shardps_worker_stats{s.bytes_pushed, s.bytes_pulled, s.requests};
  });
}

}  // extern "C"
