// TSan tree only (SHARDPS_SANITIZE=thread). Debian's Abseil is not built with
// TSan, so TSan cannot see absl::Mutex and CondVar synchronise: every access
// to ABSL_GUARDED_BY state from two threads would be reported as a race.
// This file, linked into every executable of that tree, interposes their
// public entry points (the executable's definitions win over the shared
// library's), tells TSan what each does (__tsan_mutex_*) and calls the
// library's own through dlsym(RTLD_NEXT). Abseil may evaluate a waiter's
// Condition on the thread that unlocks, so conditions are wrapped to
// synchronise with the mutex too.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "absl/synchronization/mutex.h"

// The definitions below acquire and release through the library's functions,
// which the analysis cannot follow.
#pragma clang diagnostic ignored "-Wthread-safety-analysis"

namespace {

template <typename Fn>
Fn Real(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan shim: %s not found in Abseil\n", symbol);
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Set while a shim runs: the library's functions call each other through the
// same interposed symbols (AwaitWithTimeout calls AwaitWithDeadline), and only
// the outermost call is annotated.
thread_local int shim_depth = 0;

struct OutermostCall {
  OutermostCall() { ++shim_depth; }
  ~OutermostCall() { --shim_depth; }
  static bool Nested() { return shim_depth > 0; }
};

// Whether `caller` lies in this executable (instrumented code). Calls from
// the shared libraries (gRPC's own mutexes) are not annotated: their other
// accesses are invisible to TSan, so annotating their locks alone makes
// reports of its own.
bool FromExecutable(void* caller) {
  static const void* const base = [] {
    Dl_info self;
    return dladdr(reinterpret_cast<void*>(&FromExecutable), &self) ? self.dli_fbase : nullptr;
  }();
  Dl_info info;
  return dladdr(caller, &info) != 0 && info.dli_fbase == base;
}

// The mutexes this thread holds by annotated locks, innermost last. An
// unlock (or a wait, which releases and takes again) is annotated exactly
// when its lock was, whoever calls it: a library function that locks and
// then tail-calls Unlock (absl::Notification::WaitForNotification) has the
// executable's return address on its Unlock alone, which was annotated
// without its lock ("unlock of an unlocked mutex").
thread_local std::vector<const void*> annotated_held;

bool AnnotatedHeld(const void* mu) {
  return std::find(annotated_held.rbegin(), annotated_held.rend(), mu) != annotated_held.rend();
}

// Removes `mu` from annotated_held; false when it was not there.
bool TakeAnnotated(const void* mu) {
  auto it = std::find(annotated_held.rbegin(), annotated_held.rend(), mu);
  if (it == annotated_held.rend()) return false;
  annotated_held.erase(std::next(it).base());
  return true;
}

// The mutex is released for the wait and held again after it.
template <typename Wait>
auto Released(void* mu, void* /*caller*/, Wait wait) {
  const bool annotate = !OutermostCall::Nested() && AnnotatedHeld(mu);
  OutermostCall call;  // nested calls are never annotated
  if (!annotate) return wait();
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  auto result = wait();
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

template <typename Lock>
auto Locked(void* mu, unsigned flags, void* caller, Lock lock) {
  const bool annotate = !OutermostCall::Nested() && FromExecutable(caller);
  OutermostCall call;
  if (!annotate) return lock();
  __tsan_mutex_pre_lock(mu, flags);
  auto result = lock();
  __tsan_mutex_post_lock(mu, flags, 0);
  annotated_held.push_back(mu);
  return result;
}

// A Condition evaluated under `mu` on whichever thread Abseil picks. The
// waiter builds it on its own stack and the unlocking thread reads it, handed
// over inside the library: `this` is released once built and acquired by
// Eval before it reads a field, and the other way round when the waiter
// leaves, or the stack's earlier and later contents look raced. `wrapped()`
// is built by the library's own (uninstrumented) constructor, whose
// evaluator reads it there, unseen; the header's templated one would read it
// here before any acquire.
class AnnotatedCondition {
 public:
  AnnotatedCondition(const absl::Condition& condition, void* mu)
      : condition_(&condition), mu_(mu), wrapped_(&AnnotatedCondition::Eval, static_cast<void*>(this)) {
    __tsan_release(this);
  }
  ~AnnotatedCondition() { __tsan_acquire(this); }
  AnnotatedCondition(const AnnotatedCondition&) = delete;
  AnnotatedCondition& operator=(const AnnotatedCondition&) = delete;

  const absl::Condition& wrapped() const { return wrapped_; }

 private:
  static bool Eval(void* arg) {
    __tsan_acquire(arg);
    const auto* c = static_cast<const AnnotatedCondition*>(arg);
    __tsan_acquire(c->mu_);
    const bool result = c->condition_->Eval();
    __tsan_release(c->mu_);
    __tsan_release(arg);
    return result;
  }

  const absl::Condition* const condition_;
  void* const mu_;
  const absl::Condition wrapped_;
};

#define SHIM_SYMBOL(name, mangled, type) static const auto name = Real<type>(mangled)

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex4LockEv", void (*)(Mutex*));
  Locked(this, 0, __builtin_return_address(0), [&] { real(this); return 0; });
}

void Mutex::ReaderLock() {
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex10ReaderLockEv", void (*)(Mutex*));
  Locked(this, kRead, __builtin_return_address(0), [&] { real(this); return 0; });
}

bool Mutex::TryLock() {
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex7TryLockEv", bool (*)(Mutex*));
  const bool annotate = !OutermostCall::Nested() && FromExecutable(__builtin_return_address(0));
  OutermostCall call;
  if (!annotate) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  if (ok) annotated_held.push_back(this);
  return ok;
}

void Mutex::Unlock() {
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex6UnlockEv", void (*)(Mutex*));
  const bool annotate = !OutermostCall::Nested() && TakeAnnotated(this);
  OutermostCall call;
  if (!annotate) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex12ReaderUnlockEv", void (*)(Mutex*));
  const bool annotate = !OutermostCall::Nested() && TakeAnnotated(this);
  OutermostCall call;
  if (!annotate) return real(this);
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  const AnnotatedCondition annotated(cond, this);
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Locked(this, 0, __builtin_return_address(0), [&] { real(this, annotated.wrapped()); return 0; });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  const AnnotatedCondition annotated(cond, this);
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
              bool (*)(Mutex*, const Condition&, absl::Duration));
  return Locked(this, 0, __builtin_return_address(0), [&] { return real(this, annotated.wrapped(), timeout); });
}

void Mutex::Await(const Condition& cond) {
  const AnnotatedCondition annotated(cond, this);
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Released(this, __builtin_return_address(0), [&] { real(this, annotated.wrapped()); return 0; });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  const AnnotatedCondition annotated(cond, this);
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
              bool (*)(Mutex*, const Condition&, absl::Duration));
  return Released(this, __builtin_return_address(0), [&] { return real(this, annotated.wrapped(), timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  const AnnotatedCondition annotated(cond, this);
  SHIM_SYMBOL(real, "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
              bool (*)(Mutex*, const Condition&, absl::Time));
  return Released(this, __builtin_return_address(0), [&] { return real(this, annotated.wrapped(), deadline); });
}

void CondVar::Wait(Mutex* mu) {
  SHIM_SYMBOL(real, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", void (*)(CondVar*, Mutex*));
  Released(mu, __builtin_return_address(0), [&] { real(this, mu); return 0; });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  SHIM_SYMBOL(real, "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
              bool (*)(CondVar*, Mutex*, absl::Duration));
  return Released(mu, __builtin_return_address(0), [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  SHIM_SYMBOL(real, "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
              bool (*)(CondVar*, Mutex*, absl::Time));
  return Released(mu, __builtin_return_address(0), [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
