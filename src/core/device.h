// Device identity: cpu, cuda:N, or meta (sizes only, used to dry-run a step and learn its peak memory).
#pragma once
#include <string>
#include <string_view>

namespace tr {

enum class DeviceType : uint8_t { cpu, cuda, meta };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  bool operator==(const Device&) const = default;
  std::string str() const;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  // meta:N (N > 0): a dry run's stand-in for the N-th device of a split (each with an allocator of its own).
  static Device meta(int i = 0) { return {DeviceType::meta, i}; }
  // "cpu", "meta", "cuda", "cuda:1"; throws on anything else.
  static Device parse(std::string_view s);
};

}  // namespace tr
