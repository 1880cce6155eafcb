// Zip(inputs): tuples of the inputs' elements; ends with the shortest.
#include <algorithm>

#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  if (a.inputs.empty()) return Invalid("Zip", "needs at least one input");
  bool all_infinite = true;
  int64_t card = kInfiniteCardinality;
  for (const auto& i : a.inputs) {
    if (!i->spec.known) a.spec.known = false;
    for (const auto& c : i->spec.components) a.spec.components.push_back(c);
    int64_t n = i->cardinality;
    if (n != kInfiniteCardinality) all_infinite = false;
    if (n >= 0) card = card < 0 ? n : std::min(card, n);
  }
  if (!a.spec.known) a.spec.components.clear();
  bool any_unknown = std::any_of(a.inputs.begin(), a.inputs.end(), [](const auto& i) {
    return i->cardinality == kUnknownCardinality;
  });
  if (all_infinite) a.cardinality = kInfiniteCardinality;
  else if (card == 0) a.cardinality = 0;
  else if (any_unknown) a.cardinality = kUnknownCardinality;
  else a.cardinality = card;
  return absl::OkStatus();
}

class ZipIterator : public NodeIterator {
 public:
  ZipIterator(AnalysisPtr a, std::vector<std::unique_ptr<Iterator>> in)
      : NodeIterator(std::move(a)), in_(std::move(in)) {}
  Result Next() override {
    Element out;
    std::optional<uint64_t> key = kZipKeySeed;
    for (auto& it : in_) {
      SLUICE_ASSIGN_OR_RETURN(auto e, it->Next());
      if (!e) return End();
      for (auto& t : *e) out.push_back(std::move(t));
      key = CombineKeys(key, it->ElementKey());
    }
    key_ = key;
    return Some(std::move(out));
  }
  // Its inputs' keys, in order, when they all have one.
  std::optional<uint64_t> ElementKey() const override { return key_; }
  absl::Status SaveState(proto::IteratorState* state) const override {
    SLUICE_RETURN_IF_ERROR(BeginSave(state));
    for (const auto& it : in_) SLUICE_RETURN_IF_ERROR(it->SaveState(state->add_inputs()));
    return absl::OkStatus();
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    SLUICE_RETURN_IF_ERROR(CheckState(state, 0, static_cast<int>(in_.size())));
    for (size_t i = 0; i < in_.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(in_[i]->RestoreState(state.inputs(static_cast<int>(i))));
    }
    return absl::OkStatus();
  }

 private:
  static constexpr uint64_t kZipKeySeed = 0x21b21b21b21b21b0ull;
  std::vector<std::unique_ptr<Iterator>> in_;
  std::optional<uint64_t> key_;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  std::vector<std::unique_ptr<Iterator>> in;
  for (const auto& input : a->inputs) {
    SLUICE_ASSIGN_OR_RETURN(auto it, MakeNodeIterator(input, ctx));
    in.push_back(std::move(it));
  }
  return std::unique_ptr<Iterator>(new ZipIterator(std::move(a), std::move(in)));
}

std::vector<const proto::DatasetNode*> Inputs(const proto::DatasetNode& n) {
  std::vector<const proto::DatasetNode*> out;
  for (const auto& in : n.zip().inputs()) out.push_back(&in);
  return out;
}
std::vector<proto::DatasetNode*> MutableInputs(proto::DatasetNode* n) {
  std::vector<proto::DatasetNode*> out;
  for (auto& in : *n->mutable_zip()->mutable_inputs()) out.push_back(&in);
  return out;
}

}  // namespace

extern const OpDef kZipOp = {
    .name = "Zip",
    .inputs = &Inputs,
    .mutable_inputs = &MutableInputs,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .split_passing = SplitPassing::kUntracked,
};

}  // namespace sluice::internal
