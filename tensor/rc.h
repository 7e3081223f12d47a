// Rc<T>: a minimal intrusive reference-counted pointer. Tensor handles copy in a few
// instructions and TensorImpl carries its count inline (one allocation per tensor).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace mt {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  int64_t use_count() const { return refs_.load(std::memory_order_relaxed); }

 protected:
  ~RefCounted() = default;

 private:
  template <class T> friend class Rc;
  mutable std::atomic<int64_t> refs_{0};
};

template <class T>
class Rc {
 public:
  Rc() = default;
  explicit Rc(T* p) : p_(p) { inc(); }
  Rc(const Rc& o) : p_(o.p_) { inc(); }
  Rc(Rc&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  ~Rc() { dec(); }
  Rc& operator=(const Rc& o) {
    Rc(o).swap(*this);
    return *this;
  }
  Rc& operator=(Rc&& o) noexcept {
    Rc(std::move(o)).swap(*this);
    return *this;
  }
  void swap(Rc& o) noexcept { std::swap(p_, o.p_); }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const Rc& o) const { return p_ == o.p_; }
  void reset() { Rc().swap(*this); }

 private:
  void inc() {
    if (p_) p_->refs_.fetch_add(1, std::memory_order_relaxed);
  }
  void dec() {
    if (p_ && p_->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete p_;
  }
  T* p_ = nullptr;
};

template <class T, class... Args>
Rc<T> make_rc(Args&&... args) {
  return Rc<T>(new T(std::forward<Args>(args)...));
}

}  // namespace mt
