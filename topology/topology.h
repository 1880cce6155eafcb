// Machine topology (hwloc): NUMA nodes, cores, NICs and GPUs, device
// locality, thread and memory binding, and sluice's placement policy.
// No hwloc types in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

struct NumaNodeInfo {
  int os_index = 0;           // the kernel's node number
  uint64_t memory_bytes = 0;  // local memory
  std::vector<int> cpus;      // OS indexes of the PUs (hardware threads) local to it
};

enum class DeviceKind : uint8_t { kInfiniband = 1, kEthernet = 2, kGpu = 3, kOtherNic = 4 };
const char* DeviceKindName(DeviceKind kind);

struct DeviceInfo {
  DeviceKind kind = DeviceKind::kOtherNic;
  std::string name;         // "mlx5_0", "eth0", "cuda0"/"nvidia0"/..., as the OS names it
  std::string pci_bus_id;   // "0000:3b:00.0" (empty when unknown)
  std::vector<int> numa_nodes;  // nearest NUMA nodes (OS indexes), closest first
};

class Topology {
 public:
  // This machine, with I/O devices (PCI NICs and GPUs) kept.
  static absl::StatusOr<std::unique_ptr<Topology>> LoadSystem();
  // An hwloc synthetic description, e.g. "pack:2 numa:2 core:4 pu:1".
  static absl::StatusOr<std::unique_ptr<Topology>> LoadSynthetic(const std::string& description);
  // An hwloc XML export (may describe another machine).
  static absl::StatusOr<std::unique_ptr<Topology>> LoadXml(const std::string& path);
  ~Topology();

  const std::vector<NumaNodeInfo>& numa_nodes() const { return numa_nodes_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  int num_packages() const { return num_packages_; }
  int num_cores() const { return num_cores_; }
  int num_pus() const { return num_pus_; }
  // True for LoadSystem(): binding and memory placement act on this machine.
  bool is_this_system() const { return is_this_system_; }

  // A device by OS name ("mlx5_0", "eth0") or PCI bus id ("0000:3b:00.0"
  // or "3b:00.0"); NotFound listing the known devices otherwise.
  absl::StatusOr<DeviceInfo> FindDevice(const std::string& name_or_bus_id) const;

  // Binds the calling thread to `cpus` (OS indexes). Only on this system.
  absl::Status BindCurrentThread(const std::vector<int>& cpus) const;
  // Allocates `bytes` bound to NUMA node `node` (OS index), touching every
  // page; from 2 MiB up, an aligned mapping on huge pages
  // (core/huge_pages.h). The owner frees it. Only on this system.
  absl::StatusOr<std::shared_ptr<uint8_t>> AllocateOnNode(size_t bytes, int node) const;
  // The NUMA nodes (OS indexes) the pages of [data, data + bytes) live on.
  absl::StatusOr<std::vector<int>> MemoryLocation(const void* data, size_t bytes) const;

  // Human-readable and JSON renderings (what `sluice topo` prints).
  std::string ToString() const;
  std::string ToJson() const;

  struct Impl;

 private:
  Topology() = default;
  static absl::StatusOr<std::unique_ptr<Topology>> Build(std::unique_ptr<Impl> impl,
                                                         bool this_system);
  std::unique_ptr<Impl> impl_;
  std::vector<NumaNodeInfo> numa_nodes_;
  std::vector<DeviceInfo> devices_;
  int num_packages_ = 0, num_cores_ = 0, num_pus_ = 0;
  bool is_this_system_ = false;
};

// Where a component (client receive pool + progress thread, worker send
// pool + task threads) puts its memory and threads.
struct PlacementConfig {
  // "auto": the node nearest the device below (or the NIC UCX uses);
  // "none": no binding; "<n>": NUMA node n (OS index).
  std::string numa_node = "auto";
  // Explicit CPUs ("0-3,8"); empty: the chosen node's CPUs.
  std::string cpu_list;
  // A GPU (PCI bus id) whose nearest node wins over the NIC, for GPU trainers.
  std::string gpu_pci_bus_id;
  // The NIC to place near (OS name); empty: the first InfiniBand device,
  // else the first Ethernet device.
  std::string nic;
};

struct Placement {
  int numa_node = -1;      // -1: unbound
  std::vector<int> cpus;   // empty: unbound
  std::string reason;      // one line, for the log and `sluice topo`
};

// Decides a placement. Errors (InvalidArgument) for a node that does not
// exist, an empty or out-of-range cpu list, or an unknown device.
absl::StatusOr<Placement> ChoosePlacement(const Topology& topology, const PlacementConfig& config);

// What a component needs to apply a placement on this machine, as plain
// functions (so modules that must not see the topology can use them).
struct BindingHooks {
  Placement placement;
  // Memory bound to the chosen node (pages touched); null when unbound.
  std::function<absl::StatusOr<std::shared_ptr<uint8_t>>(size_t)> allocate;
  // True when the memory lives on the chosen node.
  std::function<bool(const void*, size_t)> verify;
  // Binds the calling thread to the chosen cpus (no-op when unbound).
  std::function<void()> bind_thread;
  std::string description;  // the decision and why, one line
};

// Loads this machine's topology (once per process) and decides `config`.
// With no NIC named, the NIC UCX uses ($UCX_NET_DEVICES's first device)
// is preferred. InvalidArgument for bad configuration.
absl::StatusOr<BindingHooks> MakeBindingHooks(const PlacementConfig& config);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list);
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace sluice
