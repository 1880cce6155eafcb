// Interleave(fn, cycle_length, block_length): tf.data's deterministic
// interleave of the datasets `fn` (a dataset over a Placeholder) builds per
// input element.
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

// Interleave keeps one open dataset per cycle slot.
constexpr int64_t kMaxCycleLength = 1 << 16;

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& il = a.node->interleave();
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Interleave"));
  if (il.cycle_length() <= 0 || il.block_length() <= 0) {
    return Invalid("Interleave", "cycle_length and block_length must be > 0");
  }
  if (il.cycle_length() > kMaxCycleLength) {
    return Invalid("Interleave", absl::StrCat("cycle_length ", il.cycle_length(),
                                              " exceeds the limit of ", kMaxCycleLength));
  }
  if (a.sub == nullptr) return Invalid("Interleave", "missing function dataset");
  a.spec = a.sub->spec;
  a.cardinality = in->cardinality == 0 ? 0 : kUnknownCardinality;
  return absl::OkStatus();
}

// cycle_length slots visited in turn, block_length elements from each; a
// slot whose dataset ends is emptied and refilled from the next input
// element when the cycle comes back to it.
class InterleaveIterator : public NodeIterator {
 public:
  InterleaveIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : NodeIterator(std::move(a)), in_(std::move(in)), ctx_(ctx),
        slots_(static_cast<size_t>(node().interleave().cycle_length())) {
    ctx_.splits = nullptr;  // per-element datasets read their own sources whole
  }
  Result Next() override {
    while (!in_done_ || open_ > 0) {
      std::unique_ptr<Iterator>& slot = slots_[cycle_];
      if (slot != nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto e, slot->Next());
        if (e) {
          if (++block_ >= node().interleave().block_length()) Advance();
          return e;
        }
        slot.reset();
        --open_;
        Advance();
      } else if (!in_done_) {
        SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
        if (!e) {
          in_done_ = true;
          continue;
        }
        IteratorContext ctx = ctx_;
        ctx.salt = Mix(ctx_.salt, opened_++);
        ctx.placeholder = &*e;
        SLUICE_ASSIGN_OR_RETURN(slot, MakeNodeIterator(a_->sub, ctx));
        ++open_;
      } else {
        Advance();
      }
    }
    return End();
  }

 private:
  void Advance() {
    block_ = 0;
    cycle_ = (cycle_ + 1) % slots_.size();
  }

  std::unique_ptr<Iterator> in_;
  IteratorContext ctx_;
  std::vector<std::unique_ptr<Iterator>> slots_;
  size_t cycle_ = 0;
  int64_t block_ = 0;
  int64_t open_ = 0;
  uint64_t opened_ = 0;
  bool in_done_ = false;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto in, MakeNodeIterator(a->inputs[0], ctx));
  return std::unique_ptr<Iterator>(new InterleaveIterator(std::move(a), std::move(in), ctx));
}

const proto::DatasetNode* Function(const proto::DatasetNode& n) { return &n.interleave().fn(); }
proto::DatasetNode* MutableFunction(proto::DatasetNode* n) {
  return n->mutable_interleave()->mutable_fn();
}

}  // namespace

extern const OpDef kInterleaveOp = {
    .name = "Interleave",
    .inputs = &InputField<&proto::DatasetNode::interleave>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_interleave>,
    .function = &Function,
    .mutable_function = &MutableFunction,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .split_passing = SplitPassing::kUntracked,
    .file_sharding = FileSharding::kReadsFilesInFunction,
};

}  // namespace sluice::internal
