// Shuffle(buffer_size, seed, reshuffle_each_iteration): a uniform shuffle
// through a buffer.
#include <random>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Shuffle"));
  if (a.node->shuffle().buffer_size() <= 0) {
    return Invalid("Shuffle", absl::StrCat("buffer_size must be > 0; got ",
                                           a.node->shuffle().buffer_size()));
  }
  a.spec = in->spec;
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

class ShuffleIterator : public UnaryIterator {
 public:
  ShuffleIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, uint64_t salt)
      : UnaryIterator(std::move(a), std::move(in)) {
    const auto& s = node().shuffle();
    uint64_t seed = s.has_seed() ? s.seed() : std::random_device{}() ^
                                                  (uint64_t{std::random_device{}()} << 32);
    if (s.reshuffle_each_iteration()) seed = Mix(seed, salt);
    rng_.seed(seed);
  }
  Result Next() override {
    int64_t cap = node().shuffle().buffer_size();
    while (!in_done_ && static_cast<int64_t>(buf_.size()) < cap) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) {
        in_done_ = true;
        break;
      }
      buf_.push_back(std::move(*e));
      keys_.push_back(in_->ElementKey());
    }
    if (buf_.empty()) return End();
    std::uniform_int_distribution<size_t> pick(0, buf_.size() - 1);
    size_t i = pick(rng_);
    std::swap(buf_[i], buf_.back());
    std::swap(keys_[i], keys_.back());
    Element out = std::move(buf_.back());
    buf_.pop_back();
    key_ = keys_.back();
    keys_.pop_back();
    return Some(std::move(out));
  }
  // An element keeps its key: random functions after a shuffle give it the
  // same draw whatever the order.
  std::optional<uint64_t> ElementKey() const override { return key_; }

 private:
  std::mt19937_64 rng_;
  std::vector<Element> buf_;
  std::vector<std::optional<uint64_t>> keys_;  // buf_'s
  std::optional<uint64_t> key_;
  bool in_done_ = false;
};

// Seeded by ctx.salt, which varies per iteration and per epoch.
absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto in, MakeNodeIterator(a->inputs[0], ctx));
  return std::unique_ptr<Iterator>(new ShuffleIterator(std::move(a), std::move(in), ctx.salt));
}

}  // namespace

extern const OpDef kShuffleOp = {
    .name = "Shuffle",
    .inputs = &InputField<&proto::DatasetNode::shuffle>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_shuffle>,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .split_passing = SplitPassing::kUntracked,
};

}  // namespace sluice::internal
