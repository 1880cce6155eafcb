// DataService (Distribute / FromDatasetId): elements produced by the
// service. The pipeline before Distribute runs on workers; this node runs
// in the client, through the ServiceReader the client library attached to
// it when it built the node.
#include <atomic>

#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& d = a.node->data_service();
  if (a.sub == nullptr && d.has_dataset()) {
    // From a definition: the pipeline before Distribute, analyzed here for
    // its spec (workers analyze it again when they run it).
    SLUICE_ASSIGN_OR_RETURN(a.sub, AnalyzeTree(a.keep_alive, d.dataset().root(), nullptr));
  }
  if (d.has_dataset() == !d.dataset_id().empty()) {
    return Invalid("Distribute", "needs exactly one of a dataset definition or a dataset_id");
  }
  if (d.max_outstanding_requests() <= 0) {
    return Invalid("Distribute", "max_outstanding_requests must be > 0");
  }
  a.repetitions = std::make_shared<std::atomic<int64_t>>(0);
  if (a.sub != nullptr) {
    a.spec = a.sub->spec;
    a.cardinality =
        a.sub->cardinality == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality;
  } else {
    a.spec = ElementSpec::Unknown();
  }
  return absl::OkStatus();
}

// Each iterator is the next repetition (iteration) of the job.
absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  if (a->reader == nullptr) {
    return absl::FailedPreconditionError(
        "Distribute: this dataset reads from the sluice service but was rebuilt from its "
        "definition, which does not hold the client's settings (service TLS, token, data "
        "plane); build it in this process with sluice::Distribute or sluice::FromDatasetId "
        "(client/distribute.h)");
  }
  int64_t repetition = a->repetitions->fetch_add(1);
  const std::string* resume = nullptr;
  if (ctx.service_resume != nullptr && !ctx.service_resume->taken.exchange(true)) {
    resume = &ctx.service_resume->checkpoint;
  }
  return a->reader->MakeIterator(a->node->data_service(), repetition, resume);
}

}  // namespace

// Not splittable, and not sharded: it reads what the service shards.
extern const OpDef kDataServiceOp = {
    .name = kDataServiceOpName,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .reads_service_iterations = true,
};

}  // namespace sluice::internal
