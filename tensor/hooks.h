// HookList and HookHandle: ordered callbacks that can be removed through a handle, used for
// tensor grad hooks, post-accumulate-grad hooks, node hooks and module hooks alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace mt {

class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  // Removes the hook; a second call (or a call after the owner died) does nothing.
  void remove() {
    if (remover_) remover_();
    remover_ = nullptr;
  }

 private:
  std::function<void()> remover_;
};

template <class Fn>
class HookList {
 public:
  HookHandle add(Fn fn) {
    uint64_t id = next_id_++;
    items_->push_back({id, std::move(fn)});
    std::weak_ptr<Items> weak = items_;
    return HookHandle([weak, id] {
      if (auto items = weak.lock())
        std::erase_if(*items, [id](const auto& e) { return e.first == id; });
    });
  }
  bool empty() const { return items_->empty(); }
  // Snapshot so that a hook may remove itself (or others) while running.
  std::vector<Fn> snapshot() const {
    std::vector<Fn> out;
    out.reserve(items_->size());
    for (auto& e : *items_) out.push_back(e.second);
    return out;
  }

 private:
  using Items = std::vector<std::pair<uint64_t, Fn>>;
  std::shared_ptr<Items> items_ = std::make_shared<Items>();
  uint64_t next_id_ = 0;
};

}  // namespace mt
