// sluice: command-line utilities. `sluice topo` shows the machine topology
// as sluice sees it and where it would place buffers and threads, and why.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "sluice/topology/topology.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice: utilities for the sluice input-data service"};
  app.require_subcommand(1);
  CLI::App* topo = app.add_subcommand("topo", "show NUMA nodes, cores, NICs and GPUs, and placement");
  bool json = false;
  std::string xml, synthetic;
  sluice::PlacementConfig pc;
  topo->add_flag("--json", json, "print JSON for machines");
  topo->add_option("--xml", xml, "read an hwloc XML topology instead of this machine's");
  topo->add_option("--synthetic", synthetic, "use an hwloc synthetic topology, e.g. 'pack:2 numa:2 core:4 pu:1'");
  topo->add_option("--numa_node", pc.numa_node, "placement: auto, none or a node number")
      ->capture_default_str();
  topo->add_option("--cpu_list", pc.cpu_list, "placement: explicit cpus, e.g. 0-3,8");
  topo->add_option("--gpu", pc.gpu_pci_bus_id, "place near this GPU (PCI bus id)");
  topo->add_option("--nic", pc.nic, "place near this NIC (OS name, e.g. mlx5_0)");
  CLI11_PARSE(app, argc, argv);

  auto t = !xml.empty()         ? sluice::Topology::LoadXml(xml)
           : !synthetic.empty() ? sluice::Topology::LoadSynthetic(synthetic)
                                : sluice::Topology::LoadSystem();
  if (!t.ok()) {
    std::fprintf(stderr, "sluice topo: %s\n", t.status().ToString().c_str());
    return 1;
  }
  auto p = sluice::ChoosePlacement(**t, pc);
  if (!p.ok()) {
    std::fprintf(stderr, "sluice topo: %s\n", p.status().ToString().c_str());
    return 1;
  }
  // On this machine, check the decision for real: allocate a buffer bound
  // to the node and ask the kernel where its pages are.
  std::string verified = "not checked (not this machine)";
  if ((*t)->is_this_system() && p->numa_node >= 0) {
    auto mem = (*t)->AllocateOnNode(size_t{4} << 20, p->numa_node);
    auto where = mem.ok() ? (*t)->MemoryLocation(mem->get(), size_t{4} << 20)
                          : absl::StatusOr<std::vector<int>>(mem.status());
    if (!where.ok()) {
      verified = "failed: " + std::string(where.status().message());
    } else if (where->size() == 1 && where->front() == p->numa_node) {
      verified = "yes: a 4 MiB test buffer's pages are on node " + std::to_string(p->numa_node);
    } else {
      verified = "no: pages are on node(s) " + sluice::FormatCpuList(*where);
    }
  } else if (p->numa_node < 0) {
    verified = "not applicable (unbound)";
  }
  if (json) {
    std::string topo_json = (*t)->ToJson();
    std::printf(
        "{\"topology\":%s,\"placement\":{\"numa_node\":%d,\"cpus\":\"%s\",\"reason\":\"%s\","
        "\"memory_verified\":\"%s\"}}\n",
        topo_json.c_str(), p->numa_node, sluice::FormatCpuList(p->cpus).c_str(), p->reason.c_str(),
        verified.c_str());
    return 0;
  }
  std::printf("%s", (*t)->ToString().c_str());
  std::printf("sluice would place receive/send pools and their progress threads at: %s\n",
              p->reason.c_str());
  std::printf("memory placement verified: %s\n", verified.c_str());
  return 0;
}
