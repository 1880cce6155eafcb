// Placeholder: the element an Interleave feeds its function; valid only
// inside Interleave.fn.
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec* placeholder) {
  if (placeholder == nullptr) {
    return Invalid("Placeholder", "only valid inside an Interleave function");
  }
  a.spec = *placeholder;
  a.cardinality = 1;
  return absl::OkStatus();
}

class PlaceholderIterator : public NodeIterator {
 public:
  PlaceholderIterator(AnalysisPtr a, Element e, std::optional<uint64_t> key)
      : NodeIterator(std::move(a)), e_(std::move(e)), key_(key) {}
  Result Next() override {
    if (done_) return End();
    done_ = true;
    return Some(std::move(e_));
  }
  // The key of the input element it stands for, so that what the function
  // makes of it keeps a tie to it.
  std::optional<uint64_t> ElementKey() const override { return key_; }
  // The element it yields is made again (Interleave saves it); only
  // whether it was yielded is its own.
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveValues(state, {done_ ? 1 : 0});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t done = 0;
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, {&done}));
    done_ = done != 0;
    return absl::OkStatus();
  }

 private:
  Element e_;
  std::optional<uint64_t> key_;
  bool done_ = false;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  if (ctx.placeholder == nullptr) {
    return absl::InvalidArgumentError("Placeholder is only valid inside Interleave");
  }
  return std::unique_ptr<Iterator>(new PlaceholderIterator(std::move(a), *ctx.placeholder, ctx.placeholder_key));
}

}  // namespace

// Not splittable: a pipeline split by distributed_epoch has no Placeholder
// outside Interleave functions.
extern const OpDef kPlaceholderOp = {
    .name = "Placeholder",
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
};

}  // namespace sluice::internal
