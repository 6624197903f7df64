#include "worker/c_api.h"

#include <cstring>
#include <memory>
#include <vector>

#include "worker/worker.h"

struct shardps_worker {
  std::unique_ptr<shardps::Worker> worker;
  std::vector<shardps::TensorSpec> declared;
};

namespace {

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

template <typename F>
int StartRequest(shardps_worker* w, uint64_t* handle, char* err, size_t err_len, F start) {
  if (w == nullptr) return Null("worker", err, err_len);
  if (handle == nullptr) return Null("handle", err, err_len);
  absl::StatusOr<uint64_t> h = start();
  if (!h.ok()) return Report(h.status(), err, err_len);
  *handle = *h;
  return 0;
}

}  // namespace

extern "C" {

int shardps_worker_create(const char* scheduler_address, uint32_t rank, double rendezvous_timeout_s,
                          shardps_worker** out, char* err, size_t err_len) {
  if (scheduler_address == nullptr) return Null("scheduler_address", err, err_len);
  if (out == nullptr) return Null("out", err, err_len);
  shardps::WorkerOptions options;
  options.scheduler_address = scheduler_address;
  options.rank = rank;
  options.rendezvous_timeout = Seconds(rendezvous_timeout_s);
  auto worker = shardps::Worker::Create(options);
  if (!worker.ok()) return Report(worker.status(), err, err_len);
  *out = new shardps_worker{*std::move(worker), {}};
  return 0;
}

void shardps_worker_destroy(shardps_worker* w) { delete w; }

int shardps_declare_tensor(shardps_worker* w, const char* name, const int64_t* shape, size_t ndim, char* err,
                           size_t err_len) {
  if (w == nullptr) return Null("worker", err, err_len);
  if (name == nullptr || (shape == nullptr && ndim > 0)) return Null("name or shape", err, err_len);
  shardps::TensorSpec spec;
  spec.set_name(name);
  for (size_t i = 0; i < ndim; ++i) spec.add_shape(shape[i]);
  spec.set_dtype(shardps::FLOAT32);
  w->declared.push_back(std::move(spec));
  return 0;
}

int shardps_define_done(shardps_worker* w, char* err, size_t err_len) {
  if (w == nullptr) return Null("worker", err, err_len);
  return Report(w->worker->DefineTensors(w->declared), err, err_len);
}

int shardps_init_tensor(shardps_worker* w, const char* name, const float* values, size_t n, double timeout_s,
                        char* err, size_t err_len) {
  if (w == nullptr || name == nullptr || values == nullptr) return Null("worker, name or values", err, err_len);
  return Report(w->worker->InitTensor(name, absl::MakeConstSpan(values, n), Seconds(timeout_s)), err, err_len);
}

int shardps_barrier(shardps_worker* w, const char* name, char* err, size_t err_len) {
  if (w == nullptr || name == nullptr) return Null("worker or name", err, err_len);
  return Report(w->worker->Barrier(name), err, err_len);
}

int shardps_push(shardps_worker* w, const char* name, const float* grad, size_t n, uint64_t* handle, char* err,
                 size_t err_len) {
  if (name == nullptr || grad == nullptr) return Null("name or grad", err, err_len);
  return StartRequest(w, handle, err, err_len, [&] { return w->worker->Push(name, absl::MakeConstSpan(grad, n)); });
}

int shardps_pull(shardps_worker* w, const char* name, float* weights, size_t n, uint64_t* handle, char* err,
                 size_t err_len) {
  if (name == nullptr || weights == nullptr) return Null("name or weights", err, err_len);
  return StartRequest(w, handle, err, err_len, [&] { return w->worker->Pull(name, absl::MakeSpan(weights, n)); });
}

int shardps_push_pull(shardps_worker* w, const char* name, const float* grad, float* weights, size_t n,
                      uint64_t* handle, char* err, size_t err_len) {
  if (name == nullptr || grad == nullptr || weights == nullptr) return Null("name, grad or weights", err, err_len);
  return StartRequest(w, handle, err, err_len, [&] {
    return w->worker->PushPull(name, absl::MakeConstSpan(grad, n), absl::MakeSpan(weights, n));
  });
}

int shardps_wait(shardps_worker* w, uint64_t handle, double timeout_s, char* err, size_t err_len) {
  if (w == nullptr) return Null("worker", err, err_len);
  return Report(w->worker->Wait(handle, Seconds(timeout_s)), err, err_len);
}

}  // extern "C"
