// Shuffle(buffer_size, seed, reshuffle_each_iteration): a uniform shuffle
// through a buffer.
#include <random>
#include <sstream>

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

// How many nodes the pipeline has below `a` (its place, stably).
uint64_t NodesBelow(const Analysis& a) {
  uint64_t n = 0;
  for (const auto& in : a.inputs) n += 1 + NodesBelow(*in);
  return n;
}

class ShuffleIterator : public UnaryIterator {
 public:
  // Without a seed of its own, the shuffle draws from the pipeline's
  // (IteratorContext::seed: WithSeed's, else random per iterator, and kept
  // in checkpoints), told apart from other shuffles by its place.
  ShuffleIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : UnaryIterator(std::move(a), std::move(in)) {
    const auto& s = node().shuffle();
    uint64_t seed = s.has_seed() ? s.seed()
                                 : Mix(ctx.seed, Mix(0x5b0ff1e5b0ff1e00ull, NodesBelow(*a_)));
    if (s.reshuffle_each_iteration()) seed = Mix(seed, ctx.salt);
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
  // The buffer as data (with its elements' keys) and the
  // generator's state: a cursor cannot stand for a shuffle buffer.
  absl::Status SaveState(proto::IteratorState* state) const override {
    SLUICE_RETURN_IF_ERROR(SaveWithInput(state, {in_done_ ? 1 : 0}));
    for (size_t i = 0; i < buf_.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(SaveElement(buf_[i], state));
      state->add_values(keys_[i].has_value());
      state->add_values(static_cast<int64_t>(keys_[i].value_or(0)));
    }
    std::ostringstream rng;
    rng << rng_;
    state->set_blob(rng.str());
    return absl::OkStatus();
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    if (state.values_size() < 1 || state.values_size() != 2 * state.elements_size() + 1) {
      return CorruptCheckpoint("Shuffle's buffer and keys disagree");
    }
    SLUICE_RETURN_IF_ERROR(CheckState(state, state.values_size(), 1));
    in_done_ = state.values(0) != 0;
    buf_.clear();
    keys_.clear();
    for (int i = 0; i < state.elements_size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(Element e, RestoreElement(state, i));
      buf_.push_back(std::move(e));
      const bool has_key = state.values(2 * i + 1) != 0;
      const auto k = static_cast<uint64_t>(state.values(2 * i + 2));
      keys_.push_back(has_key ? std::optional<uint64_t>(k) : std::nullopt);
    }
    std::istringstream rng(state.blob());
    rng >> rng_;
    if (rng.fail()) return CorruptCheckpoint("Shuffle's random generator state");
    return in_->RestoreState(state.inputs(0));
  }

 private:
  std::mt19937_64 rng_;
  std::vector<Element> buf_;
  std::vector<std::optional<uint64_t>> keys_;  // buf_'s
  std::optional<uint64_t> key_;
  bool in_done_ = false;
};

// Reshuffled by ctx.salt, which varies per iteration and per epoch.
absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto in, MakeNodeIterator(a->inputs[0], ctx));
  return std::unique_ptr<Iterator>(new ShuffleIterator(std::move(a), std::move(in), ctx));
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
