// Device parsing and printing.
#include "runtime/device.h"

#include "runtime/error.h"

namespace mt {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "meta") return meta();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return cuda(std::stoi(s.substr(5)));
    } catch (const std::exception&) {
    }
  }
  MT_FAIL("unknown device '{}' (expected cpu, cuda, cuda:N or meta)", s);
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return fmt::format("cuda:{}", index);
    case DeviceType::kMeta: return "meta";
  }
  return "?";
}

}  // namespace mt
