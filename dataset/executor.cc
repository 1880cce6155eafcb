// The local executor: each op's iterator comes from its file in
// dataset/ops/; here are what wraps them (sticky ends, split readers) and
// dynamic sharding's search for the split source.

#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

// A split source under dynamic sharding: yields the elements of the splits
// it gets from ctx.splits, one split after the other, through the source
// op's split-source traits.
class SplitReaderIterator : public NodeIterator {
 public:
  SplitReaderIterator(AnalysisPtr a, const SplitSourceTraits* traits, SplitSource* splits)
      : NodeIterator(std::move(a)), traits_(traits), splits_(splits),
        epoch_(splits->BeginEpoch()) {}
  Result Next() override {
    while (true) {
      if (split_ && pos_ < split_->end) {
        SLUICE_ASSIGN_OR_RETURN(Element e, traits_->element_at(*a_, *split_, pos_));
        key_ = SourceKey(epoch_, pos_++);
        return Some(std::move(e));
      }
      SLUICE_ASSIGN_OR_RETURN(split_, splits_->Next(epoch_));
      if (!split_) return End();
      pos_ = split_->begin;
    }
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  int64_t ElementSplit() const override { return split_ ? split_->id : -1; }

 private:
  const SplitSourceTraits* const traits_;
  SplitSource* const splits_;
  const int64_t epoch_;
  std::optional<Split> split_;
  int64_t pos_ = 0;
  std::optional<uint64_t> key_;
};

// Makes the outcome after an error or the end repeat on later calls.
class StickyIterator : public Iterator {
 public:
  explicit StickyIterator(std::unique_ptr<Iterator> in) : in_(std::move(in)) {}
  Result Next() override {
    if (terminal_) return *terminal_;
    Result r = in_->Next();
    if (!r.ok() || !r->has_value()) {
      terminal_ = r;
      in_.reset();
    }
    return r;
  }
  std::optional<uint64_t> ElementKey() const override {
    return in_ != nullptr ? in_->ElementKey() : std::nullopt;
  }
  int64_t ElementSplit() const override { return in_ != nullptr ? in_->ElementSplit() : -1; }
  // An iterator at its end saves only that; one that failed cannot save.
  absl::Status SaveState(proto::IteratorState* state) const override {
    if (!terminal_) return in_->SaveState(state);
    if (!terminal_->ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "an iterator that failed cannot save its position: ", terminal_->status().message()));
    }
    state->set_op(kEndedState);
    return absl::OkStatus();
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    if (state.op() != kEndedState) return in_->RestoreState(state);
    terminal_ = Result(std::optional<Element>());
    in_.reset();
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Iterator> in_;
  std::optional<Result> terminal_;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeUnsticky(AnalysisPtr a, const IteratorContext& ctx) {
  const OpDef* op = FindOp(a->node->op_case());
  if (op == nullptr) return absl::InvalidArgumentError("dataset definition has an empty node");
  if (ctx.splits != nullptr && op->split_source != nullptr) {
    return std::unique_ptr<Iterator>(
        new SplitReaderIterator(std::move(a), op->split_source, ctx.splits));
  }
  return op->make_iterator(std::move(a), ctx);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Iterator>> MakeNodeIterator(AnalysisPtr analysis,
                                                           const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto it, MakeUnsticky(std::move(analysis), ctx));
  return std::unique_ptr<Iterator>(new StickyIterator(std::move(it)));
}

namespace {

// Collects the splittable sources under `n` (outside Interleave functions)
// and whether the path to each keeps elements tied to their source element.
absl::Status CollectSources(const proto::DatasetNode& n, bool tracked, bool reads_ahead,
                            const char* unresumable, std::vector<SplitSourceInfo>* out) {
  const OpDef* op = FindOp(n.op_case());
  if (op != nullptr && op->split_source != nullptr) {
    out->push_back({&n, tracked, tracked && reads_ahead, unresumable});
    return absl::OkStatus();
  }
  SplitPassing passing = op == nullptr ? SplitPassing::kNone
                         : op->split_passing_of != nullptr ? op->split_passing_of(n)
                                                           : op->split_passing;
  if (passing == SplitPassing::kNone) {
    return absl::InvalidArgumentError(
        "distributed_epoch: the pipeline has a node that cannot be split (a Placeholder outside "
        "Interleave, a nested Distribute or an empty node)");
  }
  const bool keeps = passing == SplitPassing::kTracked || passing == SplitPassing::kReadsAhead;
  if (unresumable == nullptr && (!keeps || op->counts_across_splits)) unresumable = op->name;
  for (const proto::DatasetNode* in : InputsOf(n)) {
    SLUICE_RETURN_IF_ERROR(CollectSources(*in, tracked && keeps,
                                          reads_ahead || passing == SplitPassing::kReadsAhead,
                                          unresumable, out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SplitSourceInfo> FindSplitSource(const proto::DatasetNode& root) {
  std::vector<SplitSourceInfo> sources;
  SLUICE_RETURN_IF_ERROR(CollectSources(root, true, false, nullptr, &sources));
  if (sources.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed_epoch needs a pipeline with exactly one Range, FromTensors or ListFiles "
        "source (outside Interleave functions) to split; this one has ",
        sources.size(), "; use parallel_epochs, or Zip/Interleave after Distribute"));
  }
  return sources[0];
}

absl::StatusOr<SplitPositions> SplitSourcePositions(const proto::DatasetNode& source) {
  const OpDef* op = FindOp(source.op_case());
  if (op == nullptr || op->split_source == nullptr) {
    return absl::InternalError(absl::StrCat(op == nullptr ? "an empty node" : op->name,
                                            " is not a source that distributed_epoch splits"));
  }
  return op->split_source->positions(source);
}

}  // namespace sluice::internal
