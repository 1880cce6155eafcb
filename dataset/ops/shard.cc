// Shard(num_shards, index): every num_shards-th element starting at index.
// Shard(kShardHint, kShardHint) is a placeholder that processing_mode
// "hint" fills in (static sharding).
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Shard"));
  int64_t k = a.node->shard().num_shards(), i = a.node->shard().index();
  a.spec = in->spec;
  if (k == kShardHint || i == kShardHint) {
    if (k != i) return Invalid("Shard", "a shard hint needs both num_shards and index = kShardHint");
    a.cardinality =
        in->cardinality == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality;
    return absl::OkStatus();
  }
  if (k <= 0) return Invalid("Shard", absl::StrCat("num_shards must be > 0; got ", k));
  if (i < 0 || i >= k) return Invalid("Shard", absl::StrCat("index must be in [0, ", k, "); got ", i));
  int64_t n = in->cardinality;
  a.cardinality = n < 0 ? n : (n > i ? (n - i + k - 1) / k : 0);
  return absl::OkStatus();
}

class ShardIterator : public ForwardingIterator {
 public:
  using ForwardingIterator::ForwardingIterator;
  Result Next() override {
    const auto& s = node().shard();
    if (s.num_shards() == kShardHint) {
      return absl::FailedPreconditionError(
          "Shard(kShardHint, kShardHint) is a placeholder for Distribute's processing_mode "
          "\"hint\"; it cannot run locally or under another processing mode");
    }
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      int64_t i = pos_++;
      if (i % s.num_shards() == s.index()) return e;
    }
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {pos_});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {&pos_});
  }

 private:
  int64_t pos_ = 0;
};

bool IsShardHint(const proto::DatasetNode& n) { return n.shard().num_shards() == kShardHint; }

void FillShardHint(proto::DatasetNode* n, int64_t num_shards, int64_t index) {
  n->mutable_shard()->set_num_shards(num_shards);
  n->mutable_shard()->set_index(index);
}

}  // namespace

extern const OpDef kShardOp = {
    .name = "Shard",
    .inputs = &InputField<&proto::DatasetNode::shard>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_shard>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<ShardIterator>,
    .split_passing = SplitPassing::kTracked,
    .counts_across_splits = true,
    .is_shard_hint = &IsShardHint,
    .fill_shard_hint = &FillShardHint,
};

}  // namespace sluice::internal
