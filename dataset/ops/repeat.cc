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

// Whether `a` or one of its inputs (transitively; not Interleave
// functions) reads iterations of a service job, as tf.data's
// HasDataServiceInput.
bool ReadsServiceIterations(const Analysis& a) {
  if (FindOp(a.node->op_case())->reads_service_iterations) return true;
  for (const auto& in : a.inputs) {
    if (ReadsServiceIterations(*in)) return true;
  }
  return false;
}

// tf.data's repeat: a finite count runs every repetition, even empty ones.
// Forever, a repetition that yields nothing ends it (the input is empty;
// going on would spin) except
// - when the input reads from the service: each repetition is the job's
//   next iteration, and one already read to the end by other consumers of
//   a shared job says nothing of the next;
// - under dynamic sharding, when other workers took the epoch's splits.
class RepeatIterator : public NodeIterator {
 public:
  RepeatIterator(AnalysisPtr a, const IteratorContext& ctx)
      : NodeIterator(std::move(a)), ctx_(ctx),
        reads_service_(ReadsServiceIterations(*a_->inputs[0])) {
    // Inputs are rebuilt every epoch, after the caller's placeholder element
    // may be gone: keep a copy.
    if (ctx.placeholder != nullptr) {
      placeholder_ = *ctx.placeholder;
      ctx_.placeholder = &*placeholder_;
    }
  }
  Result Next() override {
    const int64_t count = node().repeat().count();
    while (count == -1 || epoch_ < count) {
      if (in_ == nullptr) {
        SLUICE_RETURN_IF_ERROR(OpenEpoch());
        produced_this_epoch_ = false;
      }
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (e) {
        produced_this_epoch_ = true;
        // A split source's keys carry the splits' epoch already.
        std::optional<uint64_t> k = in_->ElementKey();
        key_ = k && ctx_.splits == nullptr ? std::optional<uint64_t>(EpochKey(*k, epoch_)) : k;
        split_ = in_->ElementSplit();
        return e;
      }
      in_.reset();
      ++epoch_;
      if (count == -1 && !produced_this_epoch_ && EmptyEpochEnds(epoch_ - 1)) return End();
    }
    return End();
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  int64_t ElementSplit() const override { return split_; }
  // The epoch, and the current epoch's input when one is open.
  absl::Status SaveState(proto::IteratorState* state) const override {
    SLUICE_RETURN_IF_ERROR(BeginSave(state));
    state->add_values(epoch_);
    state->add_values(produced_this_epoch_);
    return in_ != nullptr ? in_->SaveState(state->add_inputs()) : absl::OkStatus();
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    SLUICE_RETURN_IF_ERROR(CheckState(state, 2, state.inputs_size() > 0 ? 1 : 0));
    epoch_ = state.values(0);
    produced_this_epoch_ = state.values(1) != 0;
    in_.reset();
    if (state.inputs_size() == 0) return absl::OkStatus();
    SLUICE_RETURN_IF_ERROR(OpenEpoch());
    return in_->RestoreState(state.inputs(0));
  }

 private:
  absl::Status OpenEpoch() {
    IteratorContext ctx = ctx_;
    ctx.salt = Mix(ctx_.salt, static_cast<uint64_t>(epoch_));
    SLUICE_ASSIGN_OR_RETURN(in_, MakeNodeIterator(a_->inputs[0], ctx));
    return absl::OkStatus();
  }
  bool EmptyEpochEnds(int64_t epoch) const {
    if (reads_service_) return false;
    return ctx_.splits == nullptr || !ctx_.splits->EpochHadSplits(epoch);
  }

  std::optional<Element> placeholder_;
  IteratorContext ctx_;
  const bool reads_service_;
  std::unique_ptr<Iterator> in_;
  int64_t epoch_ = 0;
  bool produced_this_epoch_ = false;
  std::optional<uint64_t> key_;
  int64_t split_ = -1;
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
