// Devices: CPU, CUDA:i, and Meta (shape and dtype only, no storage: used for deferred init).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace mt {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1, kMeta = 2 };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  static Device meta() { return {DeviceType::kMeta, 0}; }
  // Parses "cpu", "cuda", "cuda:1", "meta".
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

}  // namespace mt

template <>
struct fmt::formatter<mt::Device> : fmt::formatter<std::string_view> {
  auto format(const mt::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
