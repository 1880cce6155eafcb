// Repeat(count): the input `count` times (-1: forever).
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

int64_t MulCard(int64_t n, int64_t k) {
  if (n == kUnknownCardinality || k == kUnknownCardinality) return kUnknownCardinality;
  if (n == 0 || k == 0) return 0;
  if (n == kInfiniteCardinality || k == kInfiniteCardinality) return kInfiniteCardinality;
  return n * k;
}

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Repeat"));
  int64_t c = a.node->repeat().count();
  if (c < -1) return Invalid("Repeat", absl::StrCat("count must be >= -1; got ", c));
  a.spec = in->spec;
  a.cardinality = MulCard(in->cardinality, c == -1 ? kInfiniteCardinality : c);
  return absl::OkStatus();
}

class RepeatIterator : public NodeIterator {
 public:
  RepeatIterator(AnalysisPtr a, const IteratorContext& ctx)
      : NodeIterator(std::move(a)), ctx_(ctx) {
    // Inputs are rebuilt every epoch, after the caller's placeholder element
    // may be gone: keep a copy.
    if (ctx.placeholder != nullptr) {
      placeholder_ = *ctx.placeholder;
      ctx_.placeholder = &*placeholder_;
    }
  }
  Result Next() override {
    int64_t count = node().repeat().count();
    while (count == -1 || epoch_ < count) {
      if (in_ == nullptr) {
        IteratorContext ctx = ctx_;
        ctx.salt = Mix(ctx_.salt, static_cast<uint64_t>(epoch_));
        SLUICE_ASSIGN_OR_RETURN(in_, MakeNodeIterator(a_->inputs[0], ctx));
        produced_this_epoch_ = false;
      }
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (e) {
        produced_this_epoch_ = true;
        return e;
      }
      in_.reset();
      ++epoch_;
      // An empty epoch stops the repetition (never spin) -- unless dynamic
      // sharding gave this epoch's splits to other workers.
      if (!produced_this_epoch_ &&
          (ctx_.splits == nullptr || !ctx_.splits->EpochHadSplits(epoch_ - 1))) {
        return End();
      }
    }
    return End();
  }

 private:
  std::optional<Element> placeholder_;
  IteratorContext ctx_;
  std::unique_ptr<Iterator> in_;
  int64_t epoch_ = 0;
  bool produced_this_epoch_ = false;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  return std::unique_ptr<Iterator>(new RepeatIterator(std::move(a), ctx));
}

}  // namespace

extern const OpDef kRepeatOp = {
    .name = "Repeat",
    .inputs = &InputField<&proto::DatasetNode::repeat>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_repeat>,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .split_passing = SplitPassing::kTracked,
};

}  // namespace sluice::internal
