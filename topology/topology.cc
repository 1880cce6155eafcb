#include "sluice/topology/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sluice/core/huge_pages.h"

namespace sluice {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kInfiniband: return "infiniband";
    case DeviceKind::kEthernet: return "ethernet";
    case DeviceKind::kGpu: return "gpu";
    case DeviceKind::kOtherNic: return "nic";
  }
  return "device";
}

// Owns the hwloc topology; shared so that bound allocations can outlive the
// Topology that made them.
struct HwlocHandle {
  hwloc_topology_t topo = nullptr;
  ~HwlocHandle() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

struct Topology::Impl {
  std::shared_ptr<HwlocHandle> handle;
};

Topology::~Topology() = default;

namespace {

std::vector<int> BitmapToVector(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  int i;
  hwloc_bitmap_foreach_begin(i, set) { out.push_back(i); }
  hwloc_bitmap_foreach_end();
  return out;
}

std::string PciBusId(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%01x", p->attr->pcidev.domain,
                    p->attr->pcidev.bus, p->attr->pcidev.dev, p->attr->pcidev.func);
      return buf;
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Topology::Impl>> Load(
    const std::function<int(hwloc_topology_t)>& configure, const std::string& what) {
  auto impl = std::make_unique<Topology::Impl>();
  impl->handle = std::make_shared<HwlocHandle>();
  if (hwloc_topology_init(&impl->handle->topo) != 0) {
    impl->handle->topo = nullptr;
    return absl::InternalError("hwloc_topology_init failed");
  }
  hwloc_topology_t t = impl->handle->topo;
  // Keep I/O objects (PCI devices and their OS devices: NICs, GPUs).
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (configure(t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc cannot use ", what, ": ",
                                                   std::strerror(errno)));
  }
  if (hwloc_topology_load(t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc cannot load ", what, ": ",
                                                   std::strerror(errno)));
  }
  return impl;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Topology>> Topology::LoadSystem() {
  auto impl = Load([](hwloc_topology_t) { return 0; }, "this machine's topology");
  if (!impl.ok()) return impl.status();
  return Build(*std::move(impl), true);
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::LoadSynthetic(const std::string& d) {
  auto impl = Load([&](hwloc_topology_t t) { return hwloc_topology_set_synthetic(t, d.c_str()); },
                   absl::StrCat("synthetic topology '", d, "'"));
  if (!impl.ok()) return impl.status();
  return Build(*std::move(impl), false);
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::LoadXml(const std::string& path) {
  auto impl = Load([&](hwloc_topology_t t) { return hwloc_topology_set_xml(t, path.c_str()); },
                   absl::StrCat("XML topology '", path, "'"));
  if (!impl.ok()) return impl.status();
  return Build(*std::move(impl), false);
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::Build(std::unique_ptr<Impl> impl,
                                                          bool this_system) {
  std::unique_ptr<Topology> topo(new Topology());
  hwloc_topology_t t = impl->handle->topo;
  topo->is_this_system_ = this_system;
  topo->num_packages_ = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE));
  topo->num_cores_ = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE));
  topo->num_pus_ = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU));
  int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    NumaNodeInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    info.cpus = BitmapToVector(node->cpuset);
    topo->numa_nodes_.push_back(std::move(info));
  }
  std::sort(topo->numa_nodes_.begin(), topo->numa_nodes_.end(),
            [](const auto& a, const auto& b) { return a.os_index < b.os_index; });
  for (hwloc_obj_t os = hwloc_get_next_osdev(t, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(t, os)) {
    DeviceInfo d;
    switch (os->attr->osdev.type) {
      case HWLOC_OBJ_OSDEV_OPENFABRICS: d.kind = DeviceKind::kInfiniband; break;
      case HWLOC_OBJ_OSDEV_NETWORK: d.kind = DeviceKind::kEthernet; break;
      case HWLOC_OBJ_OSDEV_GPU:
      case HWLOC_OBJ_OSDEV_COPROC: d.kind = DeviceKind::kGpu; break;
      default: continue;  // block devices, DMA engines
    }
    d.name = os->name ? os->name : "";
    d.pci_bus_id = PciBusId(os);
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, os);
    if (anc != nullptr) d.numa_nodes = BitmapToVector(anc->nodeset);
    topo->devices_.push_back(std::move(d));
  }
  topo->impl_ = std::move(impl);
  return topo;
}

absl::StatusOr<DeviceInfo> Topology::FindDevice(const std::string& key) const {
  for (const DeviceInfo& d : devices_) {
    if (d.name == key || (!d.pci_bus_id.empty() &&
                          (d.pci_bus_id == key ||
                           (key.size() == 7 && d.pci_bus_id.substr(5) == key)))) {
      return d;
    }
  }
  std::vector<std::string> known;
  for (const DeviceInfo& d : devices_) {
    known.push_back(d.pci_bus_id.empty() ? d.name : absl::StrCat(d.name, " (", d.pci_bus_id, ")"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no device '", key, "' in the topology; known: ",
      known.empty() ? std::string("none") : absl::StrJoin(known, ", ")));
}

absl::Status Topology::BindCurrentThread(const std::vector<int>& cpus) const {
  if (!is_this_system_) {
    return absl::FailedPreconditionError("cannot bind threads with a topology of another machine");
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int c : cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
  int rc = hwloc_set_cpubind(impl_->handle->topo, set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_free(set);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind this thread to cpus ",
                                               FormatCpuList(cpus), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<uint8_t>> Topology::AllocateOnNode(size_t bytes, int node) const {
  if (!is_this_system_) {
    return absl::FailedPreconditionError("cannot allocate memory with a topology of another machine");
  }
  bool exists = std::any_of(numa_nodes_.begin(), numa_nodes_.end(),
                            [node](const NumaNodeInfo& n) { return n.os_index == node; });
  if (!exists) {
    return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node, " does not exist"));
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_set(set, static_cast<unsigned>(node));
  hwloc_topology_t topo = impl_->handle->topo;
  // From a huge page up: an aligned mapping on huge pages (huge_pages.h),
  // bound in place before its first touch; below, hwloc maps and binds.
  const bool huge = WantsHugePages(bytes);
  auto allocate = [&](int flags) -> void* {
    if (!huge) return hwloc_alloc_membind(topo, bytes, set, HWLOC_MEMBIND_BIND, flags);
    void* m = MapHugePageAligned(bytes);
    if (m == nullptr) return nullptr;
    if (hwloc_set_area_membind(topo, m, bytes, set, HWLOC_MEMBIND_BIND, flags) == 0 ||
        !(flags & HWLOC_MEMBIND_STRICT)) {
      return m;  // not strict: bound as far as the kernel allows
    }
    const int err = errno;
    UnmapHugePageAligned(m, bytes);
    errno = err;
    return nullptr;
  };
  // Strict first: a binding the kernel refuses must not pass silently.
  void* p = allocate(HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
  if (p == nullptr) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      std::fprintf(stderr, "sluice: cannot bind memory to NUMA node %d strictly (%s); "
                   "allocating with a non-strict binding\n", node, std::strerror(errno));
    }
    p = allocate(HWLOC_MEMBIND_BYNODESET);
  }
  hwloc_bitmap_free(set);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes,
                                                     " bytes on NUMA node ", node, ": ",
                                                     std::strerror(errno)));
  }
  std::memset(p, 0, bytes);  // first touch: the pages now exist on the node
  std::shared_ptr<HwlocHandle> h = impl_->handle;
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [h, bytes, huge](uint8_t* q) {
    if (huge) {
      UnmapHugePageAligned(q, bytes);
    } else {
      hwloc_free(h->topo, q, bytes);
    }
  });
}

absl::StatusOr<std::vector<int>> Topology::MemoryLocation(const void* data, size_t bytes) const {
  if (!is_this_system_) {
    return absl::FailedPreconditionError("cannot locate memory with a topology of another machine");
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  int rc = hwloc_get_area_memlocation(impl_->handle->topo, data, bytes, set,
                                      HWLOC_MEMBIND_BYNODESET);
  std::vector<int> nodes = BitmapToVector(set);
  hwloc_bitmap_free(set);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("hwloc_get_area_memlocation: ", std::strerror(errno)));
  }
  return nodes;
}

std::string Topology::ToString() const {
  std::string out = absl::StrCat(num_packages_, " package(s), ", num_cores_, " core(s), ",
                                 num_pus_, " hardware thread(s), ", numa_nodes_.size(),
                                 " NUMA node(s)\n");
  for (const auto& n : numa_nodes_) {
    absl::StrAppend(&out, "  NUMA node ", n.os_index, ": ", n.memory_bytes >> 20, " MiB, cpus ",
                    FormatCpuList(n.cpus), "\n");
  }
  for (const auto& d : devices_) {
    std::vector<std::string> nodes;
    for (int x : d.numa_nodes) nodes.push_back(std::to_string(x));
    absl::StrAppend(&out, "  ", DeviceKindName(d.kind), " ", d.name,
                    d.pci_bus_id.empty() ? "" : absl::StrCat(" (PCI ", d.pci_bus_id, ")"),
                    ": nearest NUMA node(s) ", nodes.empty() ? "unknown" : absl::StrJoin(nodes, ","),
                    "\n");
  }
  if (devices_.empty()) absl::StrAppend(&out, "  no NICs or GPUs found\n");
  return out;
}

namespace {
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
std::string JsonInts(const std::vector<int>& v) { return absl::StrCat("[", absl::StrJoin(v, ","), "]"); }
}  // namespace

std::string Topology::ToJson() const {
  std::vector<std::string> nodes, devs;
  for (const auto& n : numa_nodes_) {
    nodes.push_back(absl::StrCat("{\"os_index\":", n.os_index, ",\"memory_bytes\":", n.memory_bytes,
                                 ",\"cpus\":", JsonInts(n.cpus), "}"));
  }
  for (const auto& d : devices_) {
    devs.push_back(absl::StrCat("{\"kind\":", JsonString(DeviceKindName(d.kind)),
                                ",\"name\":", JsonString(d.name),
                                ",\"pci_bus_id\":", JsonString(d.pci_bus_id),
                                ",\"numa_nodes\":", JsonInts(d.numa_nodes), "}"));
  }
  return absl::StrCat("{\"packages\":", num_packages_, ",\"cores\":", num_cores_,
                      ",\"pus\":", num_pus_, ",\"numa_nodes\":[", absl::StrJoin(nodes, ","),
                      "],\"devices\":[", absl::StrJoin(devs, ","), "]}");
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list) {
  std::vector<int> out;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("bad cpu list '", list, "': ", why,
                                                   "; expected e.g. 0-3,8"));
  };
  if (list.empty()) return bad("empty");
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::vector<std::string> ends = absl::StrSplit(part, '-');
    int a = 0, b = 0;
    if (ends.size() == 1) {
      if (!absl::SimpleAtoi(ends[0], &a) || a < 0) return bad(absl::StrCat("'", part, "'"));
      b = a;
    } else if (ends.size() == 2) {
      if (!absl::SimpleAtoi(ends[0], &a) || !absl::SimpleAtoi(ends[1], &b) || a < 0 || b < a) {
        return bad(absl::StrCat("'", part, "'"));
      }
    } else {
      return bad(absl::StrCat("'", part, "'"));
    }
    if (b - a > 65536) return bad("range too large");
    for (int c = a; c <= b; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<int> v = cpus;
  std::sort(v.begin(), v.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(v[i]) : absl::StrCat(v[i], "-", v[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<Placement> ChoosePlacement(const Topology& topo, const PlacementConfig& config) {
  Placement p;
  const auto& nodes = topo.numa_nodes();
  auto node_info = [&](int os) -> const NumaNodeInfo* {
    for (const auto& n : nodes) {
      if (n.os_index == os) return &n;
    }
    return nullptr;
  };
  std::vector<std::string> known;
  for (const auto& n : nodes) known.push_back(std::to_string(n.os_index));
  if (config.numa_node == "none") {
    p.reason = "placement disabled (numa_node=none)";
    return p;
  }
  if (config.numa_node == "auto" || config.numa_node.empty()) {
    absl::StatusOr<DeviceInfo> dev = absl::NotFoundError("");
    std::string why;
    if (!config.gpu_pci_bus_id.empty()) {
      dev = topo.FindDevice(config.gpu_pci_bus_id);
      if (!dev.ok()) return absl::InvalidArgumentError(absl::StrCat("gpu: ", dev.status().message()));
      why = "nearest the GPU";
    } else if (!config.nic.empty()) {
      dev = topo.FindDevice(config.nic);
      if (!dev.ok()) return absl::InvalidArgumentError(absl::StrCat("nic: ", dev.status().message()));
      why = "nearest the NIC";
    } else {
      for (DeviceKind k : {DeviceKind::kInfiniband, DeviceKind::kEthernet}) {
        for (const auto& d : topo.devices()) {
          if (d.kind == k && !d.numa_nodes.empty()) {
            dev = d;
            why = absl::StrCat("nearest the first ", DeviceKindName(k), " NIC");
            break;
          }
        }
        if (dev.ok()) break;
      }
    }
    if (dev.ok() && !dev->numa_nodes.empty()) {
      p.numa_node = dev->numa_nodes.front();
      p.reason = absl::StrCat("NUMA node ", p.numa_node, ": ", why, " ", dev->name,
                              dev->pci_bus_id.empty() ? "" : absl::StrCat(" (", dev->pci_bus_id, ")"));
    } else if (!nodes.empty()) {
      p.numa_node = nodes.front().os_index;
      p.reason = absl::StrCat("NUMA node ", p.numa_node, ": no NIC with known locality found");
    } else {
      p.reason = "no NUMA information; unbound";
      return p;
    }
  } else {
    int n = 0;
    if (!absl::SimpleAtoi(config.numa_node, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("numa_node '", config.numa_node,
                                                     "' is not auto, none or a node number"));
    }
    if (node_info(n) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("NUMA node ", n, " does not exist (nodes: ",
                                                     absl::StrJoin(known, ","), ")"));
    }
    p.numa_node = n;
    p.reason = absl::StrCat("NUMA node ", n, ": set in the configuration");
  }
  const NumaNodeInfo* info = node_info(p.numa_node);
  if (!config.cpu_list.empty()) {
    auto cpus = ParseCpuList(config.cpu_list);
    if (!cpus.ok()) return cpus.status();
    std::vector<int> all;
    for (const auto& n : nodes) all.insert(all.end(), n.cpus.begin(), n.cpus.end());
    for (int c : *cpus) {
      if (std::find(all.begin(), all.end(), c) == all.end()) {
        return absl::InvalidArgumentError(absl::StrCat("cpu ", c, " in cpu_list '",
                                                       config.cpu_list, "' does not exist (cpus: ",
                                                       FormatCpuList(all), ")"));
      }
    }
    p.cpus = *cpus;
    absl::StrAppend(&p.reason, "; cpus ", FormatCpuList(p.cpus), " (set in the configuration)");
  } else if (info != nullptr) {
    p.cpus = info->cpus;
    absl::StrAppend(&p.reason, "; cpus ", FormatCpuList(p.cpus), " (the node's)");
  }
  return p;
}

absl::StatusOr<BindingHooks> MakeBindingHooks(const PlacementConfig& config) {
  static absl::StatusOr<std::shared_ptr<const Topology>>* system = [] {
    auto t = Topology::LoadSystem();
    return new absl::StatusOr<std::shared_ptr<const Topology>>(
        t.ok() ? absl::StatusOr<std::shared_ptr<const Topology>>(std::shared_ptr<const Topology>(*std::move(t)))
               : absl::StatusOr<std::shared_ptr<const Topology>>(t.status()));
  }();
  if (!system->ok()) return system->status();
  std::shared_ptr<const Topology> topo = **system;
  PlacementConfig c = config;
  if (c.nic.empty() && c.gpu_pci_bus_id.empty() && (c.numa_node == "auto" || c.numa_node.empty())) {
    const char* env = std::getenv("UCX_NET_DEVICES");
    if (env != nullptr && *env != '\0' && std::string(env) != "all") {
      // "mlx5_0:1,mlx5_1:1" -> "mlx5_0"
      std::vector<std::string> devices = absl::StrSplit(env, ',');
      std::string name = devices.front().substr(0, devices.front().find(':'));
      if (topo->FindDevice(name).ok()) c.nic = name;  // the NIC UCX was told to use
    }
  }
  auto p = ChoosePlacement(*topo, c);
  if (!p.ok()) return p.status();
  BindingHooks h;
  h.placement = *p;
  h.description = p->reason;
  const int node = p->numa_node;
  const std::vector<int> cpus = p->cpus;
  if (node >= 0) {
    h.allocate = [topo, node](size_t bytes) { return topo->AllocateOnNode(bytes, node); };
    h.verify = [topo, node](const void* data, size_t bytes) {
      auto where = topo->MemoryLocation(data, bytes);
      return where.ok() && where->size() == 1 && where->front() == node;
    };
  }
  h.bind_thread = [topo, cpus] {
    if (!cpus.empty()) (void)topo->BindCurrentThread(cpus);
  };
  return h;
}

}  // namespace sluice
