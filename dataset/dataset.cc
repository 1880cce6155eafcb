// Dataset builder, analysis of a definition (each op validates and infers
// its spec and cardinality in dataset/ops/), fingerprint.
#include "sluice/dataset/dataset.h"

#include <algorithm>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/ops/op.h"

namespace sluice {

// ---------------------------------------------------------------------------
// Specs
// ---------------------------------------------------------------------------

std::string ComponentSpec::ToString() const {
  std::string d = dtype ? std::string(DTypeName(*dtype)) : "?";
  if (!shape) return d + "[...]";
  std::vector<std::string> dims;
  for (int64_t x : *shape) dims.push_back(x < 0 ? "?" : std::to_string(x));
  return absl::StrCat(d, "[", absl::StrJoin(dims, ","), "]");
}

std::string ElementSpec::ToString() const {
  if (!known) return "(unknown)";
  std::vector<std::string> parts;
  for (const auto& c : components) parts.push_back(c.ToString());
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

namespace internal {

uint64_t ContextSeed(const proto::DatasetDef& def) {
  if (def.has_seed()) return def.seed();
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

uint64_t Fnv1a64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeNode(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    std::vector<std::shared_ptr<const Analysis>> inputs, std::shared_ptr<const Analysis> sub,
    const ElementSpec* placeholder) {
  const OpDef* op = FindOp(node.op_case());
  if (op == nullptr) return absl::InvalidArgumentError("dataset definition has an empty node");
  auto a = std::make_shared<Analysis>();
  a->keep_alive = std::move(keep_alive);
  a->node = &node;
  a->inputs = std::move(inputs);
  a->sub = std::move(sub);
  for (const auto& in : a->inputs) {
    a->functions_below = std::max(a->functions_below, in->functions_below + (in->fn ? 1 : 0));
  }
  SLUICE_RETURN_IF_ERROR(op->analyze(*a, placeholder));
  return std::shared_ptr<const Analysis>(std::move(a));
}

absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeTree(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    const ElementSpec* placeholder) {
  const OpDef* op = FindOp(node.op_case());
  std::vector<std::shared_ptr<const Analysis>> inputs;
  for (const proto::DatasetNode* c : InputsOf(node)) {
    SLUICE_ASSIGN_OR_RETURN(auto child, AnalyzeTree(keep_alive, *c, placeholder));
    inputs.push_back(std::move(child));
  }
  std::shared_ptr<const Analysis> sub;
  if (op != nullptr && op->function != nullptr) {
    // The per-element dataset; its Placeholder stands for an input element.
    SLUICE_ASSIGN_OR_RETURN(sub, AnalyzeTree(keep_alive, *op->function(node), &inputs[0]->spec));
  }
  return AnalyzeNode(std::move(keep_alive), node, std::move(inputs), std::move(sub), placeholder);
}

}  // namespace internal

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------
namespace {

using internal::Analysis;

Dataset ErrorDataset(absl::Status s) {
  auto rep = std::make_shared<Dataset::Rep>();
  rep->status = std::move(s);
  return Dataset(std::move(rep));
}

// Wraps a finished root node. `inputs` are the datasets whose roots were
// copied into it, in field order; their analyses are reused.
Dataset Finish(proto::DatasetNode root, const std::vector<const Dataset*>& inputs,
               std::shared_ptr<const Analysis> sub = nullptr) {
  for (const Dataset* d : inputs) {
    if (!d->status().ok()) return ErrorDataset(d->status());
  }
  auto def = std::make_shared<proto::DatasetDef>();
  def->set_version(1);
  *def->mutable_root() = std::move(root);
  // The pipeline's seed carries on (Zip: the first input's that has one).
  for (const Dataset* d : inputs) {
    if (d->def().has_seed()) {
      def->set_has_seed(true);
      def->set_seed(d->def().seed());
      break;
    }
  }
  std::vector<std::shared_ptr<const Analysis>> in;
  for (const Dataset* d : inputs) in.push_back(d->rep()->analysis);
  auto analysis = internal::AnalyzeNode(def, def->root(), std::move(in), std::move(sub), nullptr);
  if (!analysis.ok()) return ErrorDataset(analysis.status());
  auto rep = std::make_shared<Dataset::Rep>();
  rep->def = std::move(def);
  rep->analysis = *std::move(analysis);
  return Dataset(std::move(rep));
}

const proto::DatasetNode& RootOf(const Dataset& d) { return d.def().root(); }

Dataset FilenamesDataset(std::vector<std::string> files) {
  std::vector<Element> elements;
  for (auto& f : files) elements.push_back({Tensor::String(f)});
  if (elements.empty()) {
    return ErrorDataset(absl::InvalidArgumentError("reading records needs at least one file"));
  }
  return Dataset::FromTensors(std::move(elements));
}

}  // namespace

namespace internal {
Dataset MakeErrorDataset(absl::Status s) { return ErrorDataset(std::move(s)); }

Dataset MakeDataServiceDataset(proto::DatasetNode node, const Dataset* input,
                               std::shared_ptr<const ServiceReader> reader) {
  if (input != nullptr && !input->status().ok()) return ErrorDataset(input->status());
  std::vector<const Dataset*> none;
  Dataset d = Finish(std::move(node), none, input != nullptr ? input->rep()->analysis : nullptr);
  if (!d.status().ok()) return d;
  // The analysis is d's own (nothing shares it yet): attach the reader.
  auto with_reader = std::make_shared<Analysis>(*d.rep()->analysis);
  with_reader->reader = std::move(reader);
  d.rep()->analysis = std::move(with_reader);
  // The seed applies to the steps after Distribute too.
  if (input != nullptr && input->def().has_seed()) return d.WithSeed(input->def().seed());
  return d;
}
}  // namespace internal

Dataset Dataset::Range(int64_t stop) { return Range(0, stop, 1); }

Dataset Dataset::Range(int64_t start, int64_t stop, int64_t step) {
  proto::DatasetNode n;
  n.mutable_range()->set_start(start);
  n.mutable_range()->set_stop(stop);
  n.mutable_range()->set_step(step);
  return Finish(std::move(n), {});
}

Dataset Dataset::FromTensors(std::vector<Element> elements) {
  proto::DatasetNode n;
  auto* ft = n.mutable_from_tensors();
  for (size_t i = 0; i < elements.size(); ++i) {
    auto* e = ft->add_elements();
    for (const Tensor& t : elements[i]) {
      if (!t.valid()) {
        return ErrorDataset(absl::InvalidArgumentError(
            absl::StrCat("FromTensors: element ", i, " holds an invalid tensor")));
      }
      *e->add_components() = internal::TensorToProto(t);
    }
  }
  return Finish(std::move(n), {});
}

Dataset Dataset::ListFiles(std::string pattern, bool recursive) {
  proto::DatasetNode n;
  n.mutable_list_files()->set_pattern(std::move(pattern));
  n.mutable_list_files()->set_recursive(recursive);
  return Finish(std::move(n), {});
}

Dataset Dataset::ReadRecords(std::vector<std::string> files) {
  return ReadRecords(FilenamesDataset(std::move(files)));
}

Dataset Dataset::ReadRecords(const Dataset& filenames) {
  if (!filenames.status().ok()) return ErrorDataset(filenames.status());
  proto::DatasetNode n;
  *n.mutable_read_records()->mutable_filenames() = RootOf(filenames);
  return Finish(std::move(n), {&filenames});
}

Dataset Dataset::WebDataset(std::string pattern, std::vector<std::string> fields,
                            bool skip_incomplete) {
  return WebDataset(ListFiles(std::move(pattern)), std::move(fields), skip_incomplete);
}

Dataset Dataset::WebDataset(std::vector<std::string> shards, std::vector<std::string> fields,
                            bool skip_incomplete) {
  return WebDataset(FilenamesDataset(std::move(shards)), std::move(fields), skip_incomplete);
}

Dataset Dataset::WebDataset(const Dataset& shards, std::vector<std::string> fields,
                            bool skip_incomplete) {
  if (!shards.status().ok()) return ErrorDataset(shards.status());
  proto::DatasetNode n;
  auto* w = n.mutable_web_dataset();
  *w->mutable_filenames() = RootOf(shards);
  for (std::string& f : fields) w->add_fields(std::move(f));
  w->set_skip_incomplete(skip_incomplete);
  return Finish(std::move(n), {&shards});
}

Dataset Dataset::ReadFixedLengthRecords(std::vector<std::string> files, int64_t record_bytes,
                                        int64_t header_bytes, int64_t footer_bytes) {
  return ReadFixedLengthRecords(FilenamesDataset(std::move(files)), record_bytes, header_bytes,
                                footer_bytes);
}

Dataset Dataset::ReadFixedLengthRecords(const Dataset& filenames, int64_t record_bytes,
                                        int64_t header_bytes, int64_t footer_bytes) {
  if (!filenames.status().ok()) return ErrorDataset(filenames.status());
  proto::DatasetNode n;
  auto* r = n.mutable_read_fixed_length_records();
  *r->mutable_filenames() = RootOf(filenames);
  r->set_record_bytes(record_bytes);
  r->set_header_bytes(header_bytes);
  r->set_footer_bytes(footer_bytes);
  return Finish(std::move(n), {&filenames});
}

Dataset Dataset::Zip(std::vector<Dataset> inputs) {
  proto::DatasetNode n;
  n.mutable_zip();
  std::vector<const Dataset*> ptrs;
  for (const Dataset& d : inputs) {
    if (!d.status().ok()) return ErrorDataset(d.status());
    *n.mutable_zip()->add_inputs() = RootOf(d);
    ptrs.push_back(&d);
  }
  return Finish(std::move(n), ptrs);
}

absl::StatusOr<Dataset> Dataset::FromDef(const proto::DatasetDef& def) {
  if (def.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("dataset definition version ", def.version(),
                                                   " is not supported; this build reads 1"));
  }
  auto owned = std::make_shared<proto::DatasetDef>(def);
  SLUICE_ASSIGN_OR_RETURN(auto analysis, internal::AnalyzeTree(owned, owned->root(), nullptr));
  auto rep = std::make_shared<Rep>();
  rep->def = std::move(owned);
  rep->analysis = std::move(analysis);
  return Dataset(std::move(rep));
}

absl::StatusOr<Dataset> Dataset::Deserialize(const std::string& bytes) {
  // Deeper than protobuf's default of 100 nested messages: a local pipeline
  // of 50 chained ops serializes, so it must come back (the service's own
  // limit is kMaxWireDatasetDepth, checked at Distribute).
  constexpr int kMaxDepth = 2000;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("cannot parse the dataset definition (over 2 GiB)");
  }
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  in.SetRecursionLimit(kMaxDepth);
  proto::DatasetDef def;
  if (!def.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot parse the dataset definition (corrupt bytes, or nested deeper than ", kMaxDepth,
        " messages)"));
  }
  return FromDef(def);
}

#define SLUICE_UNARY_OP_(field, body)                 \
  if (!status().ok()) return ErrorDataset(status());  \
  proto::DatasetNode n;                                \
  auto* op = n.mutable_##field();                      \
  *op->mutable_input() = RootOf(*this);                \
  body;                                                \
  return Finish(std::move(n), {this})

Dataset Dataset::Map(const Function& fn) const {
  SLUICE_UNARY_OP_(map, *op->mutable_fn() = fn.proto());
}
// num_parallel_calls = 1 is left unset, so sequential pipelines keep their
// definitions (and fingerprints); 0, which a definition reads as unset, is
// refused here (as tf.data does).
static Dataset ParallelCallsError(const char* op) {
  return ErrorDataset(absl::InvalidArgumentError(absl::StrCat(
      op, ": num_parallel_calls must be in [1, ", internal::kMaxParallelCalls,
      "] or kAutotune; got 0")));
}
Dataset Dataset::Map(const Function& fn, int64_t num_parallel_calls, bool deterministic) const {
  if (num_parallel_calls == 0) return ParallelCallsError("Map");
  SLUICE_UNARY_OP_(map, *op->mutable_fn() = fn.proto();
                   if (num_parallel_calls != 1) op->set_num_parallel_calls(num_parallel_calls);
                   op->set_nondeterministic(!deterministic));
}
Dataset Dataset::Filter(const Function& predicate) const {
  SLUICE_UNARY_OP_(filter, *op->mutable_predicate() = predicate.proto());
}
Dataset Dataset::Batch(int64_t batch_size, bool drop_remainder,
                       int64_t num_parallel_calls) const {
  if (num_parallel_calls == 0) return ParallelCallsError("Batch");
  SLUICE_UNARY_OP_(batch, op->set_batch_size(batch_size); op->set_drop_remainder(drop_remainder);
                   if (num_parallel_calls != 1) op->set_num_parallel_calls(num_parallel_calls));
}
Dataset Dataset::Unbatch() const { SLUICE_UNARY_OP_(unbatch, (void)op); }
Dataset Dataset::Shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration) const {
  SLUICE_UNARY_OP_(shuffle, op->set_buffer_size(buffer_size); op->set_has_seed(seed.has_value());
                   op->set_seed(seed.value_or(0));
                   op->set_reshuffle_each_iteration(reshuffle_each_iteration));
}
Dataset Dataset::Repeat(int64_t count) const { SLUICE_UNARY_OP_(repeat, op->set_count(count)); }
Dataset Dataset::Take(int64_t count) const { SLUICE_UNARY_OP_(take, op->set_count(count)); }
Dataset Dataset::Skip(int64_t count) const { SLUICE_UNARY_OP_(skip, op->set_count(count)); }
Dataset Dataset::Shard(int64_t num_shards, int64_t index) const {
  SLUICE_UNARY_OP_(shard, op->set_num_shards(num_shards); op->set_index(index));
}
Dataset Dataset::Prefetch(int64_t buffer_size) const {
  SLUICE_UNARY_OP_(prefetch, op->set_buffer_size(buffer_size));
}
Dataset Dataset::Enumerate(int64_t start) const {
  SLUICE_UNARY_OP_(enumerate, op->set_start(start));
}
#undef SLUICE_UNARY_OP_

Dataset Dataset::WithSeed(uint64_t seed) const {
  if (!status().ok()) return ErrorDataset(status());
  auto def = std::make_shared<proto::DatasetDef>(this->def());
  def->set_has_seed(true);
  def->set_seed(seed);
  auto rep = std::make_shared<Rep>();
  rep->def = std::move(def);
  rep->analysis = rep_->analysis;  // the same nodes (kept alive by it)
  return Dataset(std::move(rep));
}

Dataset Dataset::Apply(const std::function<Dataset(const Dataset&)>& transformation) const {
  if (!status().ok()) return ErrorDataset(status());
  if (!transformation) {
    return ErrorDataset(absl::InvalidArgumentError("Apply: the transformation is empty"));
  }
  return transformation(*this);
}

Dataset Dataset::Interleave(const std::function<Dataset(const Dataset&)>& fn,
                            int64_t cycle_length, int64_t block_length,
                            int64_t num_parallel_calls) const {
  if (!status().ok()) return ErrorDataset(status());
  if (num_parallel_calls == 0) return ParallelCallsError("Interleave");
  // The function sees a Placeholder source standing for one input element.
  auto ph_def = std::make_shared<proto::DatasetDef>();
  ph_def->set_version(1);
  ph_def->mutable_root()->mutable_placeholder();
  auto ph = internal::AnalyzeNode(ph_def, ph_def->root(), {}, nullptr, &element_spec());
  if (!ph.ok()) return ErrorDataset(ph.status());
  auto ph_rep = std::make_shared<Rep>();
  ph_rep->def = ph_def;
  ph_rep->analysis = *ph;
  Dataset per_element = fn(Dataset(std::move(ph_rep)));
  if (!per_element.status().ok()) {
    return ErrorDataset(absl::Status(per_element.status().code(),
                                     absl::StrCat("Interleave function: ",
                                                  per_element.status().message())));
  }
  proto::DatasetNode n;
  auto* op = n.mutable_interleave();
  *op->mutable_input() = RootOf(*this);
  *op->mutable_fn() = RootOf(per_element);
  op->set_cycle_length(cycle_length);
  op->set_block_length(block_length);
  if (num_parallel_calls != 1) op->set_num_parallel_calls(num_parallel_calls);
  return Finish(std::move(n), {this}, per_element.rep()->analysis);
}

// ---------------------------------------------------------------------------
// Inspection
// ---------------------------------------------------------------------------

const absl::Status& Dataset::status() const { return rep_->status; }

const ElementSpec& Dataset::element_spec() const {
  static const ElementSpec* unknown = new ElementSpec(ElementSpec::Unknown());
  return rep_->analysis ? rep_->analysis->spec : *unknown;
}

int64_t Dataset::Cardinality() const {
  return rep_->analysis ? rep_->analysis->cardinality : kUnknownCardinality;
}

const proto::DatasetDef& Dataset::def() const {
  static const proto::DatasetDef* empty = new proto::DatasetDef();
  return rep_->def ? *rep_->def : *empty;
}

namespace internal {

std::string CanonicalBytes(const proto::DatasetDef& def) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    def.SerializeToCodedStream(&coded);
  }
  return out;
}

uint64_t DefFingerprint(const proto::DatasetDef& def) {
  std::string bytes = CanonicalBytes(def);
  return Fnv1a64(bytes.data(), bytes.size());
}

namespace {

// Clears, in every Distribute of `m` (at any depth), where the service
// runs and who reads: its address, job name and consumer index (the
// consumers of a job save checkpoints that merge, and any rank restores the
// merged one).
void ClearServiceDeployment(google::protobuf::Message* m) {
  if (auto* ds = dynamic_cast<proto::DatasetNode::DataService*>(m)) {
    ds->clear_service();
    ds->clear_job_name();
    ds->clear_consumer_index();
  }
  const google::protobuf::Reflection* r = m->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(*m, f); ++i) {
        ClearServiceDeployment(r->MutableRepeatedMessage(m, f, i));
      }
    } else {
      ClearServiceDeployment(r->MutableMessage(m, f));
    }
  }
}

}  // namespace

uint64_t CheckpointFingerprint(const proto::DatasetDef& def) {
  proto::DatasetDef pipeline = def;
  ClearServiceDeployment(&pipeline);
  return DefFingerprint(pipeline);
}

}  // namespace internal

absl::StatusOr<std::string> Dataset::Serialize() const {
  SLUICE_RETURN_IF_ERROR(status());
  return internal::CanonicalBytes(def());
}

uint64_t Dataset::CheckpointFingerprint() const {
  std::call_once(rep_->checkpoint_fingerprint_once, [this] {
    rep_->checkpoint_fingerprint = internal::CheckpointFingerprint(def());
  });
  return rep_->checkpoint_fingerprint;
}

uint64_t Dataset::Fingerprint() const {
  if (!status().ok()) return 0;
  return internal::DefFingerprint(def());
}

std::string Dataset::DebugString() const {
  if (!status().ok()) return absl::StrCat("<invalid dataset: ", status().ToString(), ">");
  return def().root().ShortDebugString();
}

absl::StatusOr<std::unique_ptr<Iterator>> Dataset::MakeIterator() const {
  SLUICE_RETURN_IF_ERROR(status());
  internal::IteratorContext ctx;
  ctx.salt = rep_->iterations.fetch_add(1);
  ctx.seed = internal::ContextSeed(def());
  return internal::MakeRootIterator(rep_->analysis, ctx, CheckpointFingerprint());
}

absl::StatusOr<std::unique_ptr<Iterator>> Dataset::MakeIterator(
    const std::string& checkpoint) const {
  SLUICE_RETURN_IF_ERROR(status());
  return internal::RestoreRootIterator(rep_->analysis, {}, CheckpointFingerprint(), checkpoint);
}

}  // namespace sluice
