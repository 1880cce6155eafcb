// Tests of the hwloc-backed Topology (XML, synthetic and this machine),
// device lookup, the placement policy, binding and the cpu-list helpers.
//
// tests/topology/data/dual_socket.xml describes: 2 packages, each with 2 NUMA
// nodes (0,1 on package 0; 2,3 on package 1) of 16 GiB and 2 single-PU cores
// each (PUs 0-1 on node 0, 2-3 on node 1, 4-5 on node 2, 6-7 on node 3), plus
//   mlx5_0  InfiniBand (openfabrics) 0000:3b:00.0, local to NUMA node 1
//   eth2    Ethernet (network)       0000:5e:00.0, local to NUMA node 2
//   cuda0   GPU (CUDA coproc, PCI class 0302) 0000:af:00.0, local to node 3
// tests/topology/data/no_io.xml: 1 package, 1 NUMA node (8 GiB), 4 PUs, no I/O.
#include "sluice/topology/topology.h"

#include <sched.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tests/huge_pages_util.h"
#include "tests/test_util.h"

#ifndef SLUICE_TOPOLOGY_DATA_DIR
#error "SLUICE_TOPOLOGY_DATA_DIR must name tests/topology/data"
#endif

namespace sluice {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr size_t kMiB = size_t{1} << 20;

std::string DataPath(const std::string& file) {
  return std::string(SLUICE_TOPOLOGY_DATA_DIR) + "/" + file;
}

std::unique_ptr<Topology> LoadDualSocket() {
  auto t = Topology::LoadXml(DataPath("dual_socket.xml"));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

const DeviceInfo* FindByName(const Topology& t, const std::string& name) {
  for (const DeviceInfo& d : t.devices()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// The first device of kind `kind` on PCI bus id `bus_id`, if any.
const DeviceInfo* FindByKindAndBus(const Topology& t, DeviceKind kind, const std::string& bus_id) {
  for (const DeviceInfo& d : t.devices()) {
    if (d.kind == kind && d.pci_bus_id == bus_id) return &d;
  }
  return nullptr;
}

std::string DeviceNames(const Topology& t) {
  std::string s;
  for (const DeviceInfo& d : t.devices()) s += d.name + "(" + d.pci_bus_id + ") ";
  return s;
}

// A small strict JSON checker (RFC 8259 grammar, no semantic checks).
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool Valid() {
    SkipWs();
    if (!Value()) return false;
    SkipWs();
    return pos_ == s_.size();
  }

 private:
  void SkipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' ||
                                s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Literal(const char* lit) {
    const size_t n = std::strlen(lit);
    if (s_.compare(pos_, n, lit) != 0) return false;
    pos_ += n;
    return true;
  }
  bool String() {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) return false;
        const char e = s_[pos_];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i) {
            ++pos_;
            if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) {
              return false;
            }
          }
        } else if (std::strchr("\"\\/bfnrt", e) == nullptr) {
          return false;
        }
      }
      ++pos_;
    }
    return false;
  }
  bool Number() {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) return false;
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) return false;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) return false;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    return pos_ > start;
  }
  bool Value() {
    if (++depth_ > 64) return false;
    SkipWs();
    bool ok = false;
    if (pos_ >= s_.size()) {
      ok = false;
    } else if (s_[pos_] == '{') {
      ++pos_;
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        ok = true;
      } else {
        while (true) {
          SkipWs();
          if (!String()) break;
          SkipWs();
          if (pos_ >= s_.size() || s_[pos_] != ':') break;
          ++pos_;
          if (!Value()) break;
          SkipWs();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            ok = true;
          }
          break;
        }
      }
    } else if (s_[pos_] == '[') {
      ++pos_;
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        ok = true;
      } else {
        while (true) {
          if (!Value()) break;
          SkipWs();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            ok = true;
          }
          break;
        }
      }
    } else if (s_[pos_] == '"') {
      ok = String();
    } else if (s_[pos_] == 't') {
      ok = Literal("true");
    } else if (s_[pos_] == 'f') {
      ok = Literal("false");
    } else if (s_[pos_] == 'n') {
      ok = Literal("null");
    } else {
      ok = Number();
    }
    --depth_;
    return ok;
  }

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

bool IsValidJson(const std::string& s) { return JsonChecker(s).Valid(); }

TEST(JsonCheckerTest, SanityOfTheTestHelper) {
  EXPECT_TRUE(IsValidJson(R"({"a": [1, 2.5, -3e2, "x\n", true, null], "b": {}})"));
  EXPECT_FALSE(IsValidJson(R"({"a": [1, 2,]})"));
  EXPECT_FALSE(IsValidJson(R"({"a": 1)"));
  EXPECT_FALSE(IsValidJson(R"({a: 1})"));
  EXPECT_FALSE(IsValidJson(R"({"a": 1} x)"));
}

// ---------------------------------------------------------------------------
// DeviceKindName

TEST(DeviceKindTest, NamesAreDistinctAndNonEmpty) {
  std::set<std::string> names;
  for (DeviceKind k : {DeviceKind::kInfiniband, DeviceKind::kEthernet, DeviceKind::kGpu,
                       DeviceKind::kOtherNic}) {
    const char* name = DeviceKindName(k);
    ASSERT_NE(name, nullptr);
    EXPECT_GT(std::strlen(name), 0u);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), 4u);
}

// ---------------------------------------------------------------------------
// LoadXml: dual_socket.xml

TEST(TopologyXmlTest, DualSocketCounts) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->num_packages(), 2);
  EXPECT_EQ(t->num_cores(), 8);
  EXPECT_EQ(t->num_pus(), 8);
  EXPECT_FALSE(t->is_this_system());
}

TEST(TopologyXmlTest, DualSocketNumaNodes) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  const std::vector<NumaNodeInfo>& nodes = t->numa_nodes();
  ASSERT_EQ(nodes.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(nodes[i].os_index, i);
    EXPECT_EQ(nodes[i].memory_bytes, 16 * kGiB);
    EXPECT_THAT(nodes[i].cpus, ElementsAre(2 * i, 2 * i + 1));
  }
}

TEST(TopologyXmlTest, DualSocketDevices) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  SCOPED_TRACE(DeviceNames(*t));

  const DeviceInfo* ib = FindByName(*t, "mlx5_0");
  ASSERT_NE(ib, nullptr);
  EXPECT_EQ(ib->kind, DeviceKind::kInfiniband);
  EXPECT_EQ(ib->pci_bus_id, "0000:3b:00.0");
  ASSERT_THAT(ib->numa_nodes, Not(IsEmpty()));
  EXPECT_EQ(ib->numa_nodes.front(), 1);

  const DeviceInfo* eth = FindByName(*t, "eth2");
  ASSERT_NE(eth, nullptr);
  EXPECT_EQ(eth->kind, DeviceKind::kEthernet);
  EXPECT_EQ(eth->pci_bus_id, "0000:5e:00.0");
  ASSERT_THAT(eth->numa_nodes, Not(IsEmpty()));
  EXPECT_EQ(eth->numa_nodes.front(), 2);

  const DeviceInfo* gpu = FindByKindAndBus(*t, DeviceKind::kGpu, "0000:af:00.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_FALSE(gpu->name.empty());
  ASSERT_THAT(gpu->numa_nodes, Not(IsEmpty()));
  EXPECT_EQ(gpu->numa_nodes.front(), 3);

  // Nothing else is classified as InfiniBand, Ethernet or a GPU.
  for (const DeviceInfo& d : t->devices()) {
    SCOPED_TRACE(d.name);
    if (d.kind == DeviceKind::kInfiniband) {
      EXPECT_EQ(d.pci_bus_id, "0000:3b:00.0");
    }
    if (d.kind == DeviceKind::kEthernet) {
      EXPECT_EQ(d.pci_bus_id, "0000:5e:00.0");
    }
    if (d.kind == DeviceKind::kGpu) {
      EXPECT_EQ(d.pci_bus_id, "0000:af:00.0");
    }
    // Every device's nearest nodes are real nodes.
    for (int n : d.numa_nodes) EXPECT_TRUE(n >= 0 && n <= 3) << n;
  }
}

TEST(TopologyXmlTest, FindDeviceByNameAndBusId) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);

  ASSERT_OK_AND_ASSIGN(DeviceInfo by_name, t->FindDevice("mlx5_0"));
  EXPECT_EQ(by_name.name, "mlx5_0");
  EXPECT_EQ(by_name.kind, DeviceKind::kInfiniband);
  EXPECT_EQ(by_name.pci_bus_id, "0000:3b:00.0");

  ASSERT_OK_AND_ASSIGN(DeviceInfo by_full_bus, t->FindDevice("0000:3b:00.0"));
  EXPECT_EQ(by_full_bus.name, "mlx5_0");
  EXPECT_EQ(by_full_bus.kind, DeviceKind::kInfiniband);

  ASSERT_OK_AND_ASSIGN(DeviceInfo by_short_bus, t->FindDevice("3b:00.0"));
  EXPECT_EQ(by_short_bus.name, "mlx5_0");
  ASSERT_THAT(by_short_bus.numa_nodes, Not(IsEmpty()));
  EXPECT_EQ(by_short_bus.numa_nodes.front(), 1);

  ASSERT_OK_AND_ASSIGN(DeviceInfo eth, t->FindDevice("eth2"));
  EXPECT_EQ(eth.kind, DeviceKind::kEthernet);
  EXPECT_EQ(eth.pci_bus_id, "0000:5e:00.0");
  ASSERT_OK_AND_ASSIGN(DeviceInfo eth_by_bus, t->FindDevice("5e:00.0"));
  EXPECT_EQ(eth_by_bus.name, "eth2");

  ASSERT_OK_AND_ASSIGN(DeviceInfo gpu, t->FindDevice("0000:af:00.0"));
  EXPECT_EQ(gpu.kind, DeviceKind::kGpu);
  EXPECT_EQ(gpu.pci_bus_id, "0000:af:00.0");
  ASSERT_THAT(gpu.numa_nodes, Not(IsEmpty()));
  EXPECT_EQ(gpu.numa_nodes.front(), 3);
  ASSERT_OK_AND_ASSIGN(DeviceInfo gpu_by_name, t->FindDevice(gpu.name));
  EXPECT_EQ(gpu_by_name.pci_bus_id, "0000:af:00.0");
}

TEST(TopologyXmlTest, FindUnknownDeviceListsKnownOnes) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  EXPECT_STATUS(t->FindDevice("mlx9_9"), absl::StatusCode::kNotFound, "mlx5_0");
  EXPECT_STATUS(t->FindDevice("mlx9_9"), absl::StatusCode::kNotFound, "eth2");
  EXPECT_STATUS(t->FindDevice("mlx9_9"), absl::StatusCode::kNotFound, "mlx9_9");
  EXPECT_STATUS(t->FindDevice("0000:00:00.9"), absl::StatusCode::kNotFound, "mlx5_0");
  EXPECT_STATUS(t->FindDevice(""), absl::StatusCode::kNotFound, "mlx5_0");
}

TEST(TopologyXmlTest, MissingOrBadFileIsAnError) {
  const std::string missing = DataPath("does_not_exist.xml");
  auto t = Topology::LoadXml(missing);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("does_not_exist.xml"));

  // A file that is not an hwloc XML export.
  auto bad = Topology::LoadXml(std::string(SLUICE_TOPOLOGY_DATA_DIR) + "/../topology_test.cc");
  EXPECT_FALSE(bad.ok());
}

TEST(TopologyXmlTest, ToJsonIsValidAndComplete) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  const std::string json = t->ToJson();
  EXPECT_TRUE(IsValidJson(json)) << json;
  EXPECT_THAT(json, HasSubstr("\"numa_nodes\""));
  EXPECT_THAT(json, HasSubstr("\"mlx5_0\""));
  EXPECT_THAT(json, HasSubstr("\"eth2\""));
  EXPECT_THAT(json, HasSubstr("0000:3b:00.0"));
  EXPECT_THAT(json, HasSubstr("0000:af:00.0"));
}

TEST(TopologyXmlTest, ToStringMentionsNodesAndDevices) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  const std::string s = t->ToString();
  for (const NumaNodeInfo& n : t->numa_nodes()) {
    // Each node's cpus, in cpu-list form.
    EXPECT_THAT(s, HasSubstr(FormatCpuList(n.cpus))) << s;
  }
  for (const DeviceInfo& d : t->devices()) {
    EXPECT_THAT(s, HasSubstr(d.name)) << s;
  }
  EXPECT_THAT(s, HasSubstr("mlx5_0"));
  EXPECT_THAT(s, HasSubstr("eth2"));
}

// ---------------------------------------------------------------------------
// ChoosePlacement on dual_socket.xml

class DualSocketPlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topo_ = LoadDualSocket();
    ASSERT_NE(topo_, nullptr);
  }
  std::unique_ptr<Topology> topo_;
};

TEST_F(DualSocketPlacementTest, DefaultIsNearTheInfinibandNic) {
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, PlacementConfig{}));
  EXPECT_EQ(p.numa_node, 1);
  EXPECT_THAT(p.cpus, ElementsAre(2, 3));
  EXPECT_THAT(p.reason, HasSubstr("mlx5_0"));
  EXPECT_EQ(p.reason.find('\n'), std::string::npos) << p.reason;
}

TEST_F(DualSocketPlacementTest, NamedNic) {
  PlacementConfig c;
  c.nic = "eth2";
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p.numa_node, 2);
  EXPECT_THAT(p.cpus, ElementsAre(4, 5));
  EXPECT_THAT(p.reason, HasSubstr("eth2"));

  c.nic = "mlx5_0";
  ASSERT_OK_AND_ASSIGN(Placement ib, ChoosePlacement(*topo_, c));
  EXPECT_EQ(ib.numa_node, 1);
  EXPECT_THAT(ib.cpus, ElementsAre(2, 3));
}

TEST_F(DualSocketPlacementTest, GpuWinsOverNic) {
  PlacementConfig c;
  c.gpu_pci_bus_id = "0000:af:00.0";
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p.numa_node, 3);
  EXPECT_THAT(p.cpus, ElementsAre(6, 7));
  EXPECT_FALSE(p.reason.empty());

  c.nic = "eth2";  // an explicit NIC still loses to the GPU
  ASSERT_OK_AND_ASSIGN(Placement with_nic, ChoosePlacement(*topo_, c));
  EXPECT_EQ(with_nic.numa_node, 3);
  EXPECT_THAT(with_nic.cpus, ElementsAre(6, 7));
}

TEST_F(DualSocketPlacementTest, ExplicitNode) {
  PlacementConfig c;
  c.numa_node = "0";
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p.numa_node, 0);
  EXPECT_THAT(p.cpus, ElementsAre(0, 1));
  EXPECT_FALSE(p.reason.empty());

  c.numa_node = "3";
  ASSERT_OK_AND_ASSIGN(Placement p3, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p3.numa_node, 3);
  EXPECT_THAT(p3.cpus, ElementsAre(6, 7));
}

TEST_F(DualSocketPlacementTest, NoneIsUnbound) {
  PlacementConfig c;
  c.numa_node = "none";
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p.numa_node, -1);
  EXPECT_THAT(p.cpus, IsEmpty());
  EXPECT_FALSE(p.reason.empty());
}

TEST_F(DualSocketPlacementTest, ExplicitCpuList) {
  PlacementConfig c;
  c.numa_node = "3";
  c.cpu_list = "6-7";
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*topo_, c));
  EXPECT_EQ(p.numa_node, 3);
  EXPECT_THAT(p.cpus, ElementsAre(6, 7));

  c.cpu_list = "7";
  ASSERT_OK_AND_ASSIGN(Placement one, ChoosePlacement(*topo_, c));
  EXPECT_THAT(one.cpus, ElementsAre(7));

  // Empty cpu_list: the node's cpus.
  c.cpu_list = "";
  ASSERT_OK_AND_ASSIGN(Placement node_cpus, ChoosePlacement(*topo_, c));
  EXPECT_THAT(node_cpus.cpus, ElementsAre(6, 7));
}

TEST_F(DualSocketPlacementTest, BadNodeIsInvalidArgument) {
  PlacementConfig c;
  c.numa_node = "9";
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "9");
  c.numa_node = "x";
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "x");
  c.numa_node = "-2";
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "-2");
}

TEST_F(DualSocketPlacementTest, BadCpuListIsInvalidArgument) {
  PlacementConfig c;
  c.numa_node = "3";
  c.cpu_list = "100";  // no such PU
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "100");
  c.cpu_list = "3-1";
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "3-1");
  c.cpu_list = "a";
  EXPECT_STATUS(ChoosePlacement(*topo_, c), absl::StatusCode::kInvalidArgument, "a");
}

TEST_F(DualSocketPlacementTest, UnknownNicIsAnError) {
  PlacementConfig c;
  c.nic = "mlx9_9";
  const absl::StatusOr<Placement> p = ChoosePlacement(*topo_, c);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().code(),
              AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("mlx9_9"));
}

TEST_F(DualSocketPlacementTest, UnknownGpuIsAnError) {
  PlacementConfig c;
  c.gpu_pci_bus_id = "0000:00:00.9";
  const absl::StatusOr<Placement> p = ChoosePlacement(*topo_, c);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().code(),
              AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("0000:00:00.9"));
}

// ---------------------------------------------------------------------------
// no_io.xml

TEST(TopologyNoIoTest, CountsAndNoDevices) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadXml(DataPath("no_io.xml")));
  EXPECT_EQ(t->num_packages(), 1);
  EXPECT_EQ(t->num_cores(), 4);
  EXPECT_EQ(t->num_pus(), 4);
  EXPECT_FALSE(t->is_this_system());
  EXPECT_THAT(t->devices(), IsEmpty());
  ASSERT_EQ(t->numa_nodes().size(), 1u);
  EXPECT_EQ(t->numa_nodes()[0].os_index, 0);
  EXPECT_EQ(t->numa_nodes()[0].memory_bytes, 8 * kGiB);
  EXPECT_THAT(t->numa_nodes()[0].cpus, ElementsAre(0, 1, 2, 3));
  EXPECT_STATUS(t->FindDevice("eth0"), absl::StatusCode::kNotFound, "eth0");
  EXPECT_TRUE(IsValidJson(t->ToJson())) << t->ToJson();
}

TEST(TopologyNoIoTest, DefaultPlacementWithoutNic) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadXml(DataPath("no_io.xml")));
  // The header leaves "auto" with no device open: either node 0 (the only
  // one) with its cpus, or unbound. Either way it succeeds and says why.
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*t, PlacementConfig{}));
  EXPECT_FALSE(p.reason.empty());
  EXPECT_THAT(p.numa_node, AnyOf(0, -1));
  if (p.numa_node == 0) {
    EXPECT_THAT(p.cpus, ElementsAre(0, 1, 2, 3));
  }

  PlacementConfig c;
  c.numa_node = "0";
  ASSERT_OK_AND_ASSIGN(Placement p0, ChoosePlacement(*t, c));
  EXPECT_EQ(p0.numa_node, 0);
  EXPECT_THAT(p0.cpus, ElementsAre(0, 1, 2, 3));

  c.numa_node = "1";
  EXPECT_STATUS(ChoosePlacement(*t, c), absl::StatusCode::kInvalidArgument, "1");

  PlacementConfig nic;
  nic.nic = "eth0";
  EXPECT_FALSE(ChoosePlacement(*t, nic).ok());
}

// ---------------------------------------------------------------------------
// LoadSynthetic

TEST(TopologySyntheticTest, Counts) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t,
                       Topology::LoadSynthetic("pack:2 numa:2 core:2 pu:1"));
  EXPECT_EQ(t->num_packages(), 2);
  EXPECT_EQ(t->num_cores(), 8);
  EXPECT_EQ(t->num_pus(), 8);
  EXPECT_FALSE(t->is_this_system());
  ASSERT_EQ(t->numa_nodes().size(), 4u);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(t->numa_nodes()[i].os_index, i);
    EXPECT_THAT(t->numa_nodes()[i].cpus, ElementsAre(2 * i, 2 * i + 1));
    EXPECT_GT(t->numa_nodes()[i].memory_bytes, 0u);
  }
  EXPECT_THAT(t->devices(), IsEmpty());
}

TEST(TopologySyntheticTest, HyperThreads) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t,
                       Topology::LoadSynthetic("pack:1 numa:1 core:4 pu:2"));
  EXPECT_EQ(t->num_packages(), 1);
  EXPECT_EQ(t->num_cores(), 4);
  EXPECT_EQ(t->num_pus(), 8);
  ASSERT_EQ(t->numa_nodes().size(), 1u);
  EXPECT_EQ(t->numa_nodes()[0].cpus.size(), 8u);
}

TEST(TopologySyntheticTest, BadDescriptionIsInvalidArgument) {
  EXPECT_STATUS(Topology::LoadSynthetic("pack:banana"), absl::StatusCode::kInvalidArgument,
                "pack:banana");
  EXPECT_STATUS(Topology::LoadSynthetic("not a topology"), absl::StatusCode::kInvalidArgument,
                "");
}

// ---------------------------------------------------------------------------
// Binding and memory placement

TEST(TopologyXmlTest, BindingAndAllocationNeedThisSystem) {
  std::unique_ptr<Topology> t = LoadDualSocket();
  ASSERT_NE(t, nullptr);
  const auto code_ok = AnyOf(absl::StatusCode::kFailedPrecondition,
                             absl::StatusCode::kInvalidArgument);
  std::thread th([&] {
    const absl::Status s = t->BindCurrentThread({0});
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(s.code(), code_ok) << s;
  });
  th.join();
  const absl::StatusOr<std::shared_ptr<uint8_t>> mem = t->AllocateOnNode(4 * kMiB, 0);
  ASSERT_FALSE(mem.ok());
  EXPECT_THAT(mem.status().code(), code_ok) << mem.status();

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> synth,
                       Topology::LoadSynthetic("pack:1 numa:1 core:2 pu:1"));
  EXPECT_FALSE(synth->AllocateOnNode(4096, 0).ok());
}

TEST(TopologySystemTest, LoadsThisMachine) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  EXPECT_TRUE(t->is_this_system());
  ASSERT_GE(t->numa_nodes().size(), 1u);
  EXPECT_GE(t->num_pus(), 1);
  EXPECT_GE(t->num_cores(), 1);
  EXPECT_GE(t->num_packages(), 1);
  EXPECT_THAT(t->numa_nodes()[0].cpus, Not(IsEmpty()));
  EXPECT_GT(t->numa_nodes()[0].memory_bytes, 0u);
  EXPECT_TRUE(IsValidJson(t->ToJson())) << t->ToJson();
  EXPECT_FALSE(t->ToString().empty());
  // Default placement on this machine succeeds, whatever devices it has.
  ASSERT_OK_AND_ASSIGN(Placement p, ChoosePlacement(*t, PlacementConfig{}));
  EXPECT_FALSE(p.reason.empty());
}

TEST(TopologySystemTest, AllocateOnFirstNode) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  ASSERT_FALSE(t->numa_nodes().empty());
  const int node = t->numa_nodes()[0].os_index;
  const size_t bytes = 4 * kMiB;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<uint8_t> mem, t->AllocateOnNode(bytes, node));
  ASSERT_NE(mem, nullptr);
  // Usable memory.
  std::memset(mem.get(), 0xab, bytes);
  EXPECT_EQ(mem.get()[0], 0xab);
  EXPECT_EQ(mem.get()[bytes - 1], 0xab);
  ASSERT_OK_AND_ASSIGN(std::vector<int> where, t->MemoryLocation(mem.get(), bytes));
  EXPECT_THAT(where, ElementsAre(node));
}

// Memory bound to a node for the data plane's arenas is advised for huge
// pages before its first touch.
TEST(TopologySystemTest, LargeAllocationsOnANodeAreAlignedAndAdvisedForHugePages) {
  SLUICE_SKIP_WITHOUT_HUGE_PAGES();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  ASSERT_FALSE(t->numa_nodes().empty());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<uint8_t> mem,
                       t->AllocateOnNode(8 * kMiB, t->numa_nodes()[0].os_index));
  EXPECT_TRUE(sluice_test::HugePagesAdvised(mem.get()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mem.get()) % kHugePageBytes, 0u);
}

TEST(TopologySystemTest, AllocationOutlivesTopology) {
  std::shared_ptr<uint8_t> mem;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
    ASSERT_FALSE(t->numa_nodes().empty());
    ASSERT_OK_AND_ASSIGN(mem, t->AllocateOnNode(kMiB, t->numa_nodes()[0].os_index));
  }
  ASSERT_NE(mem, nullptr);
  mem.get()[0] = 1;
  mem.get()[kMiB - 1] = 2;
  mem.reset();  // frees through the shared_ptr's deleter with the Topology gone
}

TEST(TopologySystemTest, AllocateOnMissingNodeFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  EXPECT_FALSE(t->AllocateOnNode(4096, 4095).ok());
  EXPECT_FALSE(t->AllocateOnNode(4096, -1).ok());
}

TEST(TopologySystemTest, BindThreadToFirstNodeCpus) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  ASSERT_FALSE(t->numa_nodes().empty());
  const std::vector<int> cpus = t->numa_nodes()[0].cpus;
  ASSERT_FALSE(cpus.empty());
  // A separate thread, so the test runner's own affinity is left alone.
  std::thread th([&] {
    const absl::Status s = t->BindCurrentThread(cpus);
    ASSERT_TRUE(s.ok()) << s;
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    std::set<int> allowed;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) allowed.insert(c);
    }
    const std::set<int> want(cpus.begin(), cpus.end());
    EXPECT_EQ(allowed, want);
    const int running_on = sched_getcpu();
    EXPECT_TRUE(want.count(running_on) == 1) << running_on;
  });
  th.join();

  // Binding one cpu of that node works too.
  std::thread one([&] {
    const absl::Status s = t->BindCurrentThread({cpus.back()});
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(sched_getcpu(), cpus.back());
  });
  one.join();
}

TEST(TopologySystemTest, BindToMissingCpuFails) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Topology> t, Topology::LoadSystem());
  std::thread th([&] {
    EXPECT_FALSE(t->BindCurrentThread({100000}).ok());
  });
  th.join();
}

// ---------------------------------------------------------------------------
// ParseCpuList / FormatCpuList

TEST(CpuListTest, ParseAndFormatRoundTrip) {
  ASSERT_OK_AND_ASSIGN(std::vector<int> cpus, ParseCpuList("0-3,8,10-11"));
  EXPECT_THAT(cpus, ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_EQ(FormatCpuList(cpus), "0-3,8,10-11");

  ASSERT_OK_AND_ASSIGN(std::vector<int> single, ParseCpuList("5"));
  EXPECT_THAT(single, ElementsAre(5));
  EXPECT_EQ(FormatCpuList(single), "5");

  ASSERT_OK_AND_ASSIGN(std::vector<int> sparse, ParseCpuList("0,2,4"));
  EXPECT_THAT(sparse, ElementsAre(0, 2, 4));
  EXPECT_EQ(FormatCpuList(sparse), "0,2,4");

  ASSERT_OK_AND_ASSIGN(std::vector<int> pair, ParseCpuList("6-7"));
  EXPECT_THAT(pair, ElementsAre(6, 7));
  EXPECT_EQ(FormatCpuList(pair), "6-7");

  ASSERT_OK_AND_ASSIGN(std::vector<int> degenerate, ParseCpuList("4-4"));
  EXPECT_THAT(degenerate, ElementsAre(4));

  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({1, 3, 4, 5, 7}), "1,3-5,7");
}

TEST(CpuListTest, RejectsMalformedLists) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1-2-3", "0-a", ","}) {
    SCOPED_TRACE(bad);
    EXPECT_STATUS(ParseCpuList(bad), absl::StatusCode::kInvalidArgument, "");
  }
}

}  // namespace
}  // namespace sluice
