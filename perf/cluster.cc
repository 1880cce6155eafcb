#include "perf/cluster.h"

#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"

namespace sluice::perf {

constexpr absl::Duration kWorkerStartTimeout = absl::Seconds(30);

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& o) {
  std::unique_ptr<Cluster> c(new Cluster());
  DispatcherConfig dc;  // port 0: a free port on 127.0.0.1
  SLUICE_ASSIGN_OR_RETURN(c->dispatcher_, DispatchServer::Start(dc));
  std::vector<std::string> port_files;
  for (int i = 0; i < o.num_workers; ++i) {
    const std::string name = absl::StrCat(o.name, "-worker", i);
    port_files.push_back(absl::StrCat(o.scratch_dir, "/", name, ".port"));
    auto w = std::make_unique<ChildProcess>(name, absl::StrCat(o.scratch_dir, "/", name, ".log"));
    std::vector<std::string> args = {"--dispatcher", c->dispatcher_->address(),
                                     "--port", "0",
                                     "--port_file", port_files.back(),
                                     "--data_transfer_protocol", o.protocol,
                                     "--task_buffer_elements",
                                     absl::StrCat(o.task_buffer_elements)};
    if (!o.plugin.empty()) args.insert(args.end(), {"--plugin", o.plugin});
    if (o.worker_threads > 0) {
      args.insert(args.end(), {"--worker_threads", absl::StrCat(o.worker_threads)});
    }
    SLUICE_RETURN_IF_ERROR(w->Start(o.worker_binary, args, o.env));
    c->workers_.push_back(std::move(w));
  }
  // A worker writes its port file once it has registered with the dispatcher.
  for (int i = 0; i < o.num_workers; ++i) {
    SLUICE_RETURN_IF_ERROR(
        WaitForPortFile(*c->workers_[i], port_files[i], kWorkerStartTimeout).status());
  }
  return c;
}

Cluster::~Cluster() {
  for (auto& w : workers_) w->KillAndReap();
  if (dispatcher_ != nullptr) dispatcher_->Stop();
}

absl::Status Cluster::CheckWorkersAlive() {
  for (auto& w : workers_) {
    if (auto st = w->TryReap()) {
      return absl::InternalError(absl::StrCat(w->name(), " ", DescribeWaitStatus(*st),
                                              "; log:\n", w->LogTail()));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::perf
