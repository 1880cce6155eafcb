// Take(count): the first `count` elements (-1: all).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Take"));
  int64_t c = a.node->take().count();
  if (c < -1) return Invalid("Take", absl::StrCat("count must be >= -1; got ", c));
  a.spec = in->spec;
  int64_t n = in->cardinality;
  if (c == -1) a.cardinality = n;
  else if (n == kInfiniteCardinality) a.cardinality = c;
  else if (n == kUnknownCardinality) a.cardinality = c == 0 ? 0 : kUnknownCardinality;
  else a.cardinality = std::min(n, c);
  return absl::OkStatus();
}

class TakeIterator : public ForwardingIterator {
 public:
  using ForwardingIterator::ForwardingIterator;
  Result Next() override {
    int64_t c = node().take().count();
    if (c != -1 && taken_ >= c) return End();
    SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
    if (e) ++taken_;
    return e;
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {taken_});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {&taken_});
  }

 private:
  int64_t taken_ = 0;
};

}  // namespace

extern const OpDef kTakeOp = {
    .name = "Take",
    .inputs = &InputField<&proto::DatasetNode::take>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_take>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<TakeIterator>,
    .split_passing = SplitPassing::kTracked,
    .counts_across_splits = true,
};

}  // namespace sluice::internal
