// Dataset builder, validation (spec and cardinality inference), fingerprint.
#include "sluice/dataset/dataset.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"

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

uint64_t Fnv1a64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

// Interleave keeps one open dataset per cycle slot.
constexpr int64_t kMaxCycleLength = 1 << 16;

ComponentSpec ScalarSpec(DType d) { return ComponentSpec{d, std::vector<int64_t>{}}; }

int64_t MulCard(int64_t n, int64_t k) {
  if (n == kUnknownCardinality || k == kUnknownCardinality) return kUnknownCardinality;
  if (n == 0 || k == 0) return 0;
  if (n == kInfiniteCardinality || k == kInfiniteCardinality) return kInfiniteCardinality;
  return n * k;
}

absl::Status CheckFilenames(absl::string_view op, const Analysis& in) {
  if (!in.spec.known) return absl::OkStatus();
  if (in.spec.components.size() != 1) {
    return Invalid(op, absl::StrCat("filenames must be one string component; got ",
                                    in.spec.ToString()));
  }
  const ComponentSpec& c = in.spec.components[0];
  if (c.dtype && *c.dtype != DType::kString) {
    return Invalid(op, absl::StrCat("filenames must be strings; got ", c.ToString()));
  }
  if (c.shape && c.shape->size() > 1) {
    return Invalid(op, absl::StrCat("filenames must be string scalars or vectors; got ",
                                    c.ToString()));
  }
  return absl::OkStatus();
}

// Merges the specs of two elements of one FromTensors list.
absl::Status MergeInto(ElementSpec* spec, const Element& e, size_t index) {
  if (index == 0) {
    spec->known = true;
    for (const Tensor& t : e) spec->components.push_back(ComponentSpec{t.dtype(), t.shape().dims()});
    return absl::OkStatus();
  }
  if (e.size() != spec->components.size()) {
    return Invalid("FromTensors", absl::StrCat("element ", index, " has ", e.size(),
                                               " components; element 0 has ",
                                               spec->components.size()));
  }
  for (size_t i = 0; i < e.size(); ++i) {
    ComponentSpec& c = spec->components[i];
    if (*c.dtype != e[i].dtype()) {
      return Invalid("FromTensors",
                     absl::StrCat("element ", index, " component ", i, " is ",
                                  DTypeName(e[i].dtype()), "; element 0's is ", DTypeName(*c.dtype)));
    }
    if (!c.shape) continue;
    const auto& dims = e[i].shape().dims();
    if (dims.size() != c.shape->size()) {
      c.shape.reset();
      continue;
    }
    for (size_t k = 0; k < dims.size(); ++k) {
      if ((*c.shape)[k] != dims[k]) (*c.shape)[k] = -1;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeNode(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    std::vector<std::shared_ptr<const Analysis>> inputs, std::shared_ptr<const Analysis> sub,
    const ElementSpec* placeholder) {
  auto a = std::make_shared<Analysis>();
  a->keep_alive = std::move(keep_alive);
  a->node = &node;
  a->inputs = std::move(inputs);
  a->sub = std::move(sub);
  const Analysis* in = a->inputs.empty() ? nullptr : a->inputs[0].get();
  auto need_input = [&](absl::string_view op) -> absl::Status {
    if (in == nullptr) return Invalid(op, "missing input dataset");
    return absl::OkStatus();
  };
  switch (node.op_case()) {
    case proto::DatasetNode::kRange: {
      const auto& r = node.range();
      if (r.step() == 0) return Invalid("Range", "step must not be 0");
      a->spec.components = {ScalarSpec(DType::kInt64)};
      __int128 span = static_cast<__int128>(r.stop()) - r.start();
      __int128 n = 0;
      if ((r.step() > 0 && span > 0) || (r.step() < 0 && span < 0)) {
        __int128 step = r.step();
        n = (span + step + (step > 0 ? -1 : 1)) / step;
      }
      a->cardinality = static_cast<int64_t>(n);
      break;
    }
    case proto::DatasetNode::kFromTensors: {
      const auto& ft = node.from_tensors();
      for (int i = 0; i < ft.elements_size(); ++i) {
        Element e;
        for (const auto& t : ft.elements(i).components()) {
          auto tensor = TensorFromProto(t);
          if (!tensor.ok()) return Invalid("FromTensors", tensor.status().message());
          e.push_back(*std::move(tensor));
        }
        SLUICE_RETURN_IF_ERROR(MergeInto(&a->spec, e, i));
        a->elements.push_back(std::move(e));
      }
      if (ft.elements_size() == 0) a->spec = ElementSpec::Unknown();
      a->cardinality = ft.elements_size();
      break;
    }
    case proto::DatasetNode::kListFiles:
      if (node.list_files().pattern().empty()) return Invalid("ListFiles", "empty pattern");
      a->spec.components = {ScalarSpec(DType::kString)};
      a->cardinality = kUnknownCardinality;
      break;
    case proto::DatasetNode::kPlaceholder:
      if (placeholder == nullptr) {
        return Invalid("Placeholder", "only valid inside an Interleave function");
      }
      a->spec = *placeholder;
      a->cardinality = 1;
      break;
    case proto::DatasetNode::kReadRecords:
      SLUICE_RETURN_IF_ERROR(need_input("ReadRecords"));
      SLUICE_RETURN_IF_ERROR(CheckFilenames("ReadRecords", *in));
      a->spec.components = {ScalarSpec(DType::kString)};
      a->cardinality = kUnknownCardinality;
      break;
    case proto::DatasetNode::kReadFixedLengthRecords: {
      const auto& r = node.read_fixed_length_records();
      SLUICE_RETURN_IF_ERROR(need_input("ReadFixedLengthRecords"));
      SLUICE_RETURN_IF_ERROR(CheckFilenames("ReadFixedLengthRecords", *in));
      if (r.record_bytes() <= 0) return Invalid("ReadFixedLengthRecords", "record_bytes must be > 0");
      if (r.header_bytes() < 0 || r.footer_bytes() < 0) {
        return Invalid("ReadFixedLengthRecords", "header_bytes and footer_bytes must be >= 0");
      }
      a->spec.components = {ScalarSpec(DType::kString)};
      a->cardinality = kUnknownCardinality;
      break;
    }
    case proto::DatasetNode::kMap: {
      SLUICE_RETURN_IF_ERROR(need_input("Map"));
      SLUICE_ASSIGN_OR_RETURN(a->fn, CompiledFunction::Compile(node.map().fn(), in->spec, "Map"));
      a->spec = a->fn->output_spec();
      a->cardinality = in->cardinality;
      break;
    }
    case proto::DatasetNode::kFilter: {
      SLUICE_RETURN_IF_ERROR(need_input("Filter"));
      SLUICE_ASSIGN_OR_RETURN(
          a->fn, CompiledFunction::Compile(node.filter().predicate(), in->spec, "Filter"));
      const ElementSpec& out = a->fn->output_spec();
      if (out.known) {
        bool ok = out.components.size() == 1 &&
                  (!out.components[0].dtype || *out.components[0].dtype == DType::kBool) &&
                  (!out.components[0].shape || out.components[0].shape->empty());
        if (!ok) {
          return Invalid("Filter", absl::StrCat("predicate must yield one bool scalar; it yields ",
                                                out.ToString()));
        }
      }
      a->spec = in->spec;
      a->cardinality = in->cardinality == kInfiniteCardinality ? kInfiniteCardinality
                                                                : kUnknownCardinality;
      break;
    }
    case proto::DatasetNode::kBatch: {
      const auto& b = node.batch();
      SLUICE_RETURN_IF_ERROR(need_input("Batch"));
      if (b.batch_size() <= 0) {
        return Invalid("Batch", absl::StrCat("batch_size must be > 0; got ", b.batch_size()));
      }
      a->spec.known = in->spec.known;
      for (const auto& c : in->spec.components) {
        ComponentSpec o = c;
        if (c.shape) {
          o.shape->insert(o.shape->begin(), b.drop_remainder() ? b.batch_size() : -1);
        }
        a->spec.components.push_back(std::move(o));
      }
      int64_t n = in->cardinality;
      if (n >= 0) {
        a->cardinality = b.drop_remainder() ? n / b.batch_size()
                                            : (n + b.batch_size() - 1) / b.batch_size();
      } else {
        a->cardinality = n;
      }
      break;
    }
    case proto::DatasetNode::kUnbatch: {
      SLUICE_RETURN_IF_ERROR(need_input("Unbatch"));
      a->spec.known = in->spec.known;
      for (size_t i = 0; i < in->spec.components.size(); ++i) {
        ComponentSpec o = in->spec.components[i];
        if (o.shape) {
          if (o.shape->empty()) {
            return Invalid("Unbatch", absl::StrCat("component ", i,
                                                   " is a scalar; Unbatch needs rank >= 1"));
          }
          o.shape->erase(o.shape->begin());
        }
        a->spec.components.push_back(std::move(o));
      }
      a->cardinality = in->cardinality == kInfiniteCardinality ? kInfiniteCardinality
                                                                : kUnknownCardinality;
      break;
    }
    case proto::DatasetNode::kShuffle:
      SLUICE_RETURN_IF_ERROR(need_input("Shuffle"));
      if (node.shuffle().buffer_size() <= 0) {
        return Invalid("Shuffle", absl::StrCat("buffer_size must be > 0; got ",
                                               node.shuffle().buffer_size()));
      }
      a->spec = in->spec;
      a->cardinality = in->cardinality;
      break;
    case proto::DatasetNode::kRepeat: {
      SLUICE_RETURN_IF_ERROR(need_input("Repeat"));
      int64_t c = node.repeat().count();
      if (c < -1) return Invalid("Repeat", absl::StrCat("count must be >= -1; got ", c));
      a->spec = in->spec;
      a->cardinality = MulCard(in->cardinality, c == -1 ? kInfiniteCardinality : c);
      break;
    }
    case proto::DatasetNode::kTake: {
      SLUICE_RETURN_IF_ERROR(need_input("Take"));
      int64_t c = node.take().count();
      if (c < -1) return Invalid("Take", absl::StrCat("count must be >= -1; got ", c));
      a->spec = in->spec;
      int64_t n = in->cardinality;
      if (c == -1) a->cardinality = n;
      else if (n == kInfiniteCardinality) a->cardinality = c;
      else if (n == kUnknownCardinality) a->cardinality = c == 0 ? 0 : kUnknownCardinality;
      else a->cardinality = std::min(n, c);
      break;
    }
    case proto::DatasetNode::kSkip: {
      SLUICE_RETURN_IF_ERROR(need_input("Skip"));
      int64_t c = node.skip().count();
      if (c < -1) return Invalid("Skip", absl::StrCat("count must be >= -1; got ", c));
      a->spec = in->spec;
      int64_t n = in->cardinality;
      if (c == -1) a->cardinality = n == kInfiniteCardinality ? kInfiniteCardinality : 0;
      else if (n < 0) a->cardinality = n;
      else a->cardinality = std::max<int64_t>(0, n - c);
      break;
    }
    case proto::DatasetNode::kShard: {
      SLUICE_RETURN_IF_ERROR(need_input("Shard"));
      int64_t k = node.shard().num_shards(), i = node.shard().index();
      if (k == kShardHint || i == kShardHint) {
        if (k != i) {
          return Invalid("Shard", "a shard hint needs both num_shards and index = kShardHint");
        }
        a->spec = in->spec;
        a->cardinality = in->cardinality == kInfiniteCardinality ? kInfiniteCardinality
                                                                 : kUnknownCardinality;
        break;
      }
      if (k <= 0) return Invalid("Shard", absl::StrCat("num_shards must be > 0; got ", k));
      if (i < 0 || i >= k) {
        return Invalid("Shard", absl::StrCat("index must be in [0, ", k, "); got ", i));
      }
      a->spec = in->spec;
      int64_t n = in->cardinality;
      a->cardinality = n < 0 ? n : (n > i ? (n - i + k - 1) / k : 0);
      break;
    }
    case proto::DatasetNode::kPrefetch:
      SLUICE_RETURN_IF_ERROR(need_input("Prefetch"));
      if (node.prefetch().buffer_size() <= 0) {
        return Invalid("Prefetch", absl::StrCat("buffer_size must be > 0; got ",
                                                node.prefetch().buffer_size()));
      }
      a->spec = in->spec;
      a->cardinality = in->cardinality;
      break;
    case proto::DatasetNode::kInterleave: {
      const auto& il = node.interleave();
      SLUICE_RETURN_IF_ERROR(need_input("Interleave"));
      if (il.cycle_length() <= 0 || il.block_length() <= 0) {
        return Invalid("Interleave", "cycle_length and block_length must be > 0");
      }
      if (il.cycle_length() > kMaxCycleLength) {
        return Invalid("Interleave", absl::StrCat("cycle_length ", il.cycle_length(),
                                                  " exceeds the limit of ", kMaxCycleLength));
      }
      if (a->sub == nullptr) return Invalid("Interleave", "missing function dataset");
      a->spec = a->sub->spec;
      a->cardinality = in->cardinality == 0 ? 0 : kUnknownCardinality;
      break;
    }
    case proto::DatasetNode::kEnumerate:
      SLUICE_RETURN_IF_ERROR(need_input("Enumerate"));
      a->spec.known = in->spec.known;
      a->spec.components.push_back(ScalarSpec(DType::kInt64));
      for (const auto& c : in->spec.components) a->spec.components.push_back(c);
      a->cardinality = in->cardinality;
      break;
    case proto::DatasetNode::kZip: {
      if (a->inputs.empty()) return Invalid("Zip", "needs at least one input");
      bool all_infinite = true;
      int64_t card = kInfiniteCardinality;
      for (const auto& i : a->inputs) {
        if (!i->spec.known) a->spec.known = false;
        for (const auto& c : i->spec.components) a->spec.components.push_back(c);
        int64_t n = i->cardinality;
        if (n != kInfiniteCardinality) all_infinite = false;
        if (n >= 0) card = card < 0 ? n : std::min(card, n);
      }
      if (!a->spec.known) a->spec.components.clear();
      bool any_unknown = std::any_of(a->inputs.begin(), a->inputs.end(), [](const auto& i) {
        return i->cardinality == kUnknownCardinality;
      });
      if (all_infinite) a->cardinality = kInfiniteCardinality;
      else if (card == 0) a->cardinality = 0;
      else if (any_unknown) a->cardinality = kUnknownCardinality;
      else a->cardinality = card;
      break;
    }
    case proto::DatasetNode::kDataService: {
      const auto& d = node.data_service();
      if (d.has_dataset() == !d.dataset_id().empty()) {
        return Invalid("Distribute", "needs exactly one of a dataset definition or a dataset_id");
      }
      if (d.max_outstanding_requests() <= 0) {
        return Invalid("Distribute", "max_outstanding_requests must be > 0");
      }
      a->repetitions = std::make_shared<std::atomic<int64_t>>(0);
      if (a->sub != nullptr) {
        a->spec = a->sub->spec;
        a->cardinality = a->sub->cardinality == kInfiniteCardinality ? kInfiniteCardinality
                                                                      : kUnknownCardinality;
      } else {
        a->spec = ElementSpec::Unknown();
      }
      break;
    }
    case proto::DatasetNode::OP_NOT_SET:
      return absl::InvalidArgumentError("dataset definition has an empty node");
  }
  return std::shared_ptr<const Analysis>(std::move(a));
}

absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeTree(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    const ElementSpec* placeholder) {
  std::vector<const proto::DatasetNode*> children;
  const proto::DatasetNode* fn = nullptr;
  switch (node.op_case()) {
    case proto::DatasetNode::kReadRecords: children = {&node.read_records().filenames()}; break;
    case proto::DatasetNode::kReadFixedLengthRecords:
      children = {&node.read_fixed_length_records().filenames()};
      break;
    case proto::DatasetNode::kMap: children = {&node.map().input()}; break;
    case proto::DatasetNode::kFilter: children = {&node.filter().input()}; break;
    case proto::DatasetNode::kBatch: children = {&node.batch().input()}; break;
    case proto::DatasetNode::kUnbatch: children = {&node.unbatch().input()}; break;
    case proto::DatasetNode::kShuffle: children = {&node.shuffle().input()}; break;
    case proto::DatasetNode::kRepeat: children = {&node.repeat().input()}; break;
    case proto::DatasetNode::kTake: children = {&node.take().input()}; break;
    case proto::DatasetNode::kSkip: children = {&node.skip().input()}; break;
    case proto::DatasetNode::kShard: children = {&node.shard().input()}; break;
    case proto::DatasetNode::kPrefetch: children = {&node.prefetch().input()}; break;
    case proto::DatasetNode::kInterleave:
      children = {&node.interleave().input()};
      fn = &node.interleave().fn();
      break;
    case proto::DatasetNode::kEnumerate: children = {&node.enumerate().input()}; break;
    case proto::DatasetNode::kZip:
      for (const auto& i : node.zip().inputs()) children.push_back(&i);
      break;
    default: break;
  }
  std::vector<std::shared_ptr<const Analysis>> inputs;
  for (const auto* c : children) {
    SLUICE_ASSIGN_OR_RETURN(auto child, AnalyzeTree(keep_alive, *c, placeholder));
    inputs.push_back(std::move(child));
  }
  std::shared_ptr<const Analysis> sub;
  if (fn != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(sub, AnalyzeTree(keep_alive, *fn, &inputs[0]->spec));
  }
  if (node.op_case() == proto::DatasetNode::kDataService && node.data_service().has_dataset()) {
    // The pipeline before Distribute; analyzed here for its spec (workers
    // analyze it again when they run it).
    SLUICE_ASSIGN_OR_RETURN(sub,
                            AnalyzeTree(keep_alive, node.data_service().dataset().root(), nullptr));
  }
  return AnalyzeNode(std::move(keep_alive), node, std::move(inputs), std::move(sub), placeholder);
}

namespace {
std::atomic<DataServiceIteratorFactory> g_data_service_factory{nullptr};
}  // namespace

void SetDataServiceIteratorFactory(DataServiceIteratorFactory factory) {
  g_data_service_factory.store(factory);
}

DataServiceIteratorFactory GetDataServiceIteratorFactory() {
  return g_data_service_factory.load();
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

Dataset MakeDataServiceDataset(proto::DatasetNode node, const Dataset* input) {
  if (input != nullptr && !input->status().ok()) return ErrorDataset(input->status());
  std::vector<const Dataset*> none;
  return Finish(std::move(node), none,
                input != nullptr ? input->rep()->analysis : nullptr);
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

Dataset Dataset::ListFiles(std::string pattern) {
  proto::DatasetNode n;
  n.mutable_list_files()->set_pattern(std::move(pattern));
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
  proto::DatasetDef def;
  if (!def.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("cannot parse the dataset definition (corrupt bytes)");
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
Dataset Dataset::Filter(const Function& predicate) const {
  SLUICE_UNARY_OP_(filter, *op->mutable_predicate() = predicate.proto());
}
Dataset Dataset::Batch(int64_t batch_size, bool drop_remainder) const {
  SLUICE_UNARY_OP_(batch, op->set_batch_size(batch_size); op->set_drop_remainder(drop_remainder));
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

Dataset Dataset::Interleave(const std::function<Dataset(const Dataset&)>& fn,
                            int64_t cycle_length, int64_t block_length) const {
  if (!status().ok()) return ErrorDataset(status());
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

}  // namespace internal

absl::StatusOr<std::string> Dataset::Serialize() const {
  SLUICE_RETURN_IF_ERROR(status());
  return internal::CanonicalBytes(def());
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
  return internal::MakeNodeIterator(rep_->analysis, ctx);
}

}  // namespace sluice
