// FromTensors(elements): the given elements; a split source.
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

// Merges element `index` of the list into `spec` (element 0 sets it).
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

// Decodes the elements once, into a.elements.
absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& ft = a.node->from_tensors();
  for (int i = 0; i < ft.elements_size(); ++i) {
    Element e;
    for (const auto& t : ft.elements(i).components()) {
      auto tensor = TensorFromProto(t);
      if (!tensor.ok()) return Invalid("FromTensors", tensor.status().message());
      e.push_back(*std::move(tensor));
    }
    SLUICE_RETURN_IF_ERROR(MergeInto(&a.spec, e, i));
    a.elements.push_back(std::move(e));
  }
  if (ft.elements_size() == 0) a.spec = ElementSpec::Unknown();
  a.cardinality = ft.elements_size();
  return absl::OkStatus();
}

class FromTensorsIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    if (i_ >= a_->elements.size()) return End();
    key_ = SourceKey(0, static_cast<int64_t>(i_));
    return Some(a_->elements[i_++]);
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveValues(state, {static_cast<int64_t>(i_)});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t i = 0;
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, {&i}));
    if (i < 0 || i > static_cast<int64_t>(a_->elements.size())) {
      return CorruptCheckpoint(absl::StrCat("FromTensors position ", i, " of ",
                                            a_->elements.size(), " elements"));
    }
    i_ = static_cast<size_t>(i);
    return absl::OkStatus();
  }

 private:
  size_t i_ = 0;
  std::optional<uint64_t> key_;
};

// One element per split.
absl::StatusOr<SplitPositions> Positions(const proto::DatasetNode& node) {
  SplitPositions p;
  p.positions = node.from_tensors().elements_size();
  return p;
}

absl::StatusOr<Element> ElementAt(const Analysis& a, const Split& split, int64_t pos) {
  if (pos < 0 || pos >= static_cast<int64_t>(a.elements.size())) {
    return absl::OutOfRangeError(absl::StrCat("split ", split.id, " names element ", pos,
                                              " of a FromTensors source with ",
                                              a.elements.size()));
  }
  return a.elements[pos];
}

// As a file-name input (ReadRecords of a list of files).
absl::StatusOr<int64_t> KnownFiles(const proto::DatasetNode& node) {
  return node.from_tensors().elements_size();
}

const SplitSourceTraits kSplits = {.positions = &Positions, .element_at = &ElementAt};

}  // namespace

extern const OpDef kFromTensorsOp = {
    .name = "FromTensors",
    .analyze = &Analyze,
    .make_iterator = &MakeSourceIterator<FromTensorsIterator>,
    .split_source = &kSplits,
    .known_files = &KnownFiles,
};

}  // namespace sluice::internal
