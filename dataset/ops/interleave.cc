// Interleave(fn, cycle_length, block_length): tf.data's deterministic
// interleave of the datasets `fn` (a dataset over a Placeholder) builds per
// input element.
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

// Interleave keeps one open dataset per cycle slot.
constexpr int64_t kMaxCycleLength = 1 << 16;

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& il = a.node->interleave();
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Interleave"));
  SLUICE_RETURN_IF_ERROR(CheckParallelCalls("Interleave", il.num_parallel_calls()));
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
// element when the cycle comes back to it. Subclasses hold the slots.
class CycleIterator : public NodeIterator {
 public:
  CycleIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : NodeIterator(std::move(a)),
        cycle_length_(static_cast<size_t>(node().interleave().cycle_length())),
        block_length_(node().interleave().block_length()), in_(std::move(in)), ctx_(ctx) {
    ctx_.splits = nullptr;  // per-element datasets read their own sources whole
  }
  Result Next() override {
    while (!in_done_ || open_ > 0) {
      if (HasSlot(cycle_)) {
        std::optional<uint64_t> sub_key;
        Result r = ReadSlot(cycle_, &sub_key);
        if (!r.ok()) return r;
        if (r->has_value()) {
          const std::optional<uint64_t>& origin = origins_[cycle_]->key;
          key_ = origin && sub_key ? std::optional<uint64_t>(Mix(*origin, *sub_key))
                                   : std::nullopt;
          if (++block_ >= block_length_) Advance();
          return r;
        }
        CloseSlot(cycle_);
        --open_;
        Advance();
      } else if (!in_done_) {
        SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
        if (!e) {
          in_done_ = true;
          continue;
        }
        const std::optional<uint64_t> key = in_->ElementKey();
        SLUICE_ASSIGN_OR_RETURN(auto it, MakeSlotIterator(*e, key, opened_));
        origins_[cycle_] = Origin{std::move(*e), opened_++, key};
        OpenSlot(cycle_, std::move(it));
        ++open_;
      } else {
        Advance();
      }
    }
    return End();
  }
  // The key of the element a slot's dataset yields mixed with the key of
  // the input element that opened the slot (whose key its Placeholder
  // passes on): nullopt unless both are kept.
  std::optional<uint64_t> ElementKey() const override { return key_; }

  // Checkpoints: the cycle's position, the input's, and per slot the input
  // element that opened it (its dataset is made again from it), what the
  // slot holds read ahead and its dataset's position.
  absl::Status SaveState(proto::IteratorState* state) const override {
    SLUICE_RETURN_IF_ERROR(SaveValues(state, {static_cast<int64_t>(cycle_), block_, open_,
                                              static_cast<int64_t>(opened_), in_done_}));
    SLUICE_RETURN_IF_ERROR(in_->SaveState(state->add_inputs()));
    for (size_t k = 0; k < cycle_length_; ++k) {
      proto::IteratorState* slot = state->add_inputs();
      if (!origins_[k] || !HasSlot(k)) {
        slot->set_op(kEmptySlot);
        continue;
      }
      slot->set_op(kSlot);
      slot->add_values(static_cast<int64_t>(origins_[k]->number));
      slot->add_values(origins_[k]->key.has_value());
      slot->add_values(static_cast<int64_t>(origins_[k]->key.value_or(0)));
      SLUICE_RETURN_IF_ERROR(SaveSlot(k, slot));
      SLUICE_RETURN_IF_ERROR(SaveElement(origins_[k]->element, slot->add_inputs()));
    }
    return absl::OkStatus();
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t cycle = 0, opened = 0, in_done = 0;
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, {&cycle, &block_, &open_, &opened, &in_done},
                                         1 + static_cast<int>(cycle_length_)));
    if (cycle < 0 || cycle >= static_cast<int64_t>(cycle_length_) || opened < 0) {
      return CorruptCheckpoint("Interleave's cycle position");
    }
    cycle_ = static_cast<size_t>(cycle);
    opened_ = static_cast<uint64_t>(opened);
    in_done_ = in_done != 0;
    SLUICE_RETURN_IF_ERROR(in_->RestoreState(state.inputs(0)));
    for (size_t k = 0; k < cycle_length_; ++k) {
      const proto::IteratorState& slot = state.inputs(1 + static_cast<int>(k));
      if (slot.op() == kEmptySlot) continue;
      if (slot.op() != kSlot || slot.values_size() < kSlotValues || slot.inputs_size() != 2) {
        return CorruptCheckpoint(absl::StrCat("Interleave's slot ", k));
      }
      SLUICE_ASSIGN_OR_RETURN(Element e, RestoreElement(slot.inputs(1), 0));
      const auto number = static_cast<uint64_t>(slot.values(0));
      const std::optional<uint64_t> key =
          slot.values(1) != 0 ? std::optional<uint64_t>(static_cast<uint64_t>(slot.values(2)))
                              : std::nullopt;
      SLUICE_ASSIGN_OR_RETURN(auto it, MakeSlotIterator(e, key, number));
      origins_[k] = Origin{std::move(e), number, key};
      SLUICE_RETURN_IF_ERROR(RestoreSlot(k, std::move(it), slot));
    }
    return absl::OkStatus();
  }

 protected:
  // A slot's checkpoint: values[0] its number, values[1..2] whether its
  // input element had a key and the key; SaveSlot appends what it holds
  // ahead (SaveHeld, from values[kSlotValues]) and its dataset's state
  // (inputs[0]); inputs[1] holds the element that opened it.
  static constexpr int kSlotValues = 3;
  virtual absl::Status SaveSlot(size_t k, proto::IteratorState* slot) const = 0;
  virtual absl::Status RestoreSlot(size_t k, std::unique_ptr<Iterator> it,
                                   const proto::IteratorState& slot) = 0;
  virtual bool HasSlot(size_t k) const = 0;
  // The slot's next element (and its key in the slot's dataset), its end,
  // or an error.
  virtual Result ReadSlot(size_t k, std::optional<uint64_t>* key) = 0;
  virtual void OpenSlot(size_t k, std::unique_ptr<Iterator> it) = 0;
  virtual void CloseSlot(size_t k) = 0;  // after ReadSlot returned its end

  size_t cycle() const { return cycle_; }
  const size_t cycle_length_;
  const int64_t block_length_;

 private:
  void Advance() {
    block_ = 0;
    cycle_ = (cycle_ + 1) % cycle_length_;
  }

  // The dataset `fn` makes of input element `e` (keyed `key`), the
  // `number`-th opened.
  absl::StatusOr<std::unique_ptr<Iterator>> MakeSlotIterator(const Element& e,
                                                              std::optional<uint64_t> key,
                                                              uint64_t number) const {
    IteratorContext ctx = ctx_;
    ctx.salt = Mix(ctx_.salt, number);
    ctx.placeholder = &e;
    ctx.placeholder_key = key;
    return MakeNodeIterator(a_->sub, ctx);
  }

  static constexpr char kSlot[] = "<slot>";
  static constexpr char kEmptySlot[] = "<empty slot>";
  struct Origin {
    Element element;
    uint64_t number = 0;
    std::optional<uint64_t> key;
  };
  std::vector<std::optional<Origin>> origins_ = std::vector<std::optional<Origin>>(cycle_length_);
  std::unique_ptr<Iterator> in_;
  IteratorContext ctx_;
  size_t cycle_ = 0;
  int64_t block_ = 0;
  int64_t open_ = 0;
  uint64_t opened_ = 0;
  bool in_done_ = false;
  std::optional<uint64_t> key_;
};

class InterleaveIterator : public CycleIterator {
 public:
  InterleaveIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : CycleIterator(std::move(a), std::move(in), ctx), slots_(cycle_length_) {}

 private:
  bool HasSlot(size_t k) const override { return slots_[k] != nullptr; }
  absl::Status SaveSlot(size_t k, proto::IteratorState* slot) const override {
    SLUICE_RETURN_IF_ERROR(SaveHeld({}, slot));  // nothing read ahead
    return slots_[k]->SaveState(slot->add_inputs());
  }
  absl::Status RestoreSlot(size_t k, std::unique_ptr<Iterator> it,
                           const proto::IteratorState& slot) override {
    SLUICE_RETURN_IF_ERROR(it->RestoreState(slot.inputs(0)));
    slots_[k] = std::move(it);
    return absl::OkStatus();
  }
  Result ReadSlot(size_t k, std::optional<uint64_t>* key) override {
    Result r = slots_[k]->Next();
    if (r.ok() && r->has_value()) *key = slots_[k]->ElementKey();
    return r;
  }
  void OpenSlot(size_t k, std::unique_ptr<Iterator> it) override { slots_[k] = std::move(it); }
  void CloseSlot(size_t k) override { slots_[k].reset(); }

  std::vector<std::unique_ptr<Iterator>> slots_;
};

// The same order, with up to `parallelism` slots read ahead at once on the
// pool, block_length elements each. The consumer's thread pulls the input
// and opens slots; a slot's dataset is read by one fill at a time (or, when
// no fill is in flight, not at all). Memory: at most cycle_length x
// block_length elements buffered. The destructor cancels fills not yet
// started and waits for running ones.
class ParallelInterleaveIterator : public CycleIterator {
 public:
  ParallelInterleaveIterator(AnalysisPtr a, std::unique_ptr<Iterator> in,
                             const IteratorContext& ctx)
      : CycleIterator(std::move(a), std::move(in), ctx), st_(std::make_shared<Shared>()),
        slots_(cycle_length_) {
    parallelism_ = std::min(ResolveParallelism(node().interleave().num_parallel_calls()),
                            node().interleave().cycle_length());
  }
  ~ParallelInterleaveIterator() override {
    st_->cancelled.store(true);
    for (auto& slot : slots_) {
      if (slot != nullptr && slot->fill != nullptr) slot->fill->Wait();
    }
  }

 private:
  struct Shared {
    std::atomic<bool> cancelled{false};
  };
  struct Slot {
    std::unique_ptr<Iterator> it;     // read only by this slot's fill
    absl::Mutex mu;                   // between the fill and the consumer
    std::deque<HeldResult> buf ABSL_GUARDED_BY(mu);  // results with their keys
    bool ended ABSL_GUARDED_BY(mu) = false;  // the end or an error is in buf
    std::shared_ptr<PoolTask> fill;   // the last fill made (consumer's thread only)
  };

  bool HasSlot(size_t k) const override { return slots_[k] != nullptr; }
  void OpenSlot(size_t k, std::unique_ptr<Iterator> it) override {
    slots_[k] = std::make_shared<Slot>();
    slots_[k]->it = std::move(it);
  }
  // Its fill is waited for: what it read ahead is saved as data, and its
  // dataset's position is the one after it.
  absl::Status SaveSlot(size_t k, proto::IteratorState* state) const override {
    Slot& s = *slots_[k];
    if (s.fill != nullptr) s.fill->Wait();
    absl::MutexLock l(&s.mu);
    std::vector<const HeldResult*> held;
    for (const HeldResult& h : s.buf) held.push_back(&h);
    SLUICE_RETURN_IF_ERROR(SaveHeld(held, state));
    if (s.ended) {
      state->add_inputs()->set_op(kEndedState);
      return absl::OkStatus();
    }
    return s.it->SaveState(state->add_inputs());
  }
  absl::Status RestoreSlot(size_t k, std::unique_ptr<Iterator> it,
                           const proto::IteratorState& state) override {
    SLUICE_ASSIGN_OR_RETURN(std::vector<HeldResult> held, RestoreHeld(state, kSlotValues));
    SLUICE_RETURN_IF_ERROR(it->RestoreState(state.inputs(0)));
    OpenSlot(k, std::move(it));
    Slot& s = *slots_[k];
    absl::MutexLock l(&s.mu);
    for (HeldResult& h : held) {
      if (!h.result.ok() || !h.result->has_value()) s.ended = true;
      s.buf.push_back(std::move(h));
    }
    return absl::OkStatus();
  }
  void CloseSlot(size_t k) override {
    if (slots_[k]->fill != nullptr) slots_[k]->fill->Wait();  // it pushed the end; let it return
    slots_[k].reset();
  }
  Result ReadSlot(size_t k, std::optional<uint64_t>* key) override {
    StartFills();
    return Take(*slots_[k], key);
  }

  // Starts fills for slots from the current one on, in cycle order, while
  // fewer than parallelism_ are in flight.
  void StartFills() {
    int64_t in_flight = 0;
    std::vector<Slot*> wanted;
    for (size_t k = 0; k < slots_.size(); ++k) {
      Slot* s = slots_[(cycle() + k) % slots_.size()].get();
      if (s == nullptr) continue;
      if (s->fill != nullptr && !s->fill->done()) {
        ++in_flight;
        continue;
      }
      absl::MutexLock l(&s->mu);
      if (s->buf.empty() && !s->ended) wanted.push_back(s);
    }
    for (Slot* s : wanted) {
      if (in_flight >= parallelism_) break;
      s->fill = MakeFill(s);
      Schedule(s->fill);
      ++in_flight;
    }
  }

  // Reads up to block_length elements of `s` into its buffer.
  std::shared_ptr<PoolTask> MakeFill(Slot* s) {
    return std::make_shared<PoolTask>([st = st_, s, n = block_length_] {
      for (int64_t i = 0; i < n && !st->cancelled.load(); ++i) {
        Result r = s->it->Next();
        const bool terminal = !r.ok() || !r->has_value();
        std::optional<uint64_t> key;
        if (!terminal) key = s->it->ElementKey();
        absl::MutexLock l(&s->mu);
        s->buf.push_back({std::move(r), key});
        if (terminal) {
          s->ended = true;
          return;
        }
      }
    });
  }

  // The slot's next result and its key, waiting for (or running) its fill.
  Result Take(Slot& slot, std::optional<uint64_t>* key) {
    Result r = End();
    while (true) {
      {
        absl::MutexLock l(&slot.mu);
        if (!slot.buf.empty()) {
          r = std::move(slot.buf.front().result);
          *key = slot.buf.front().key;
          slot.buf.pop_front();
          return r;
        }
      }
      // Empty and not ended: its fill is in flight (wait for it, or run
      // it here if queued), or none is, and this thread reads it.
      if (slot.fill == nullptr || slot.fill->done()) slot.fill = MakeFill(&slot);
      slot.fill->Wait();
    }
  }

  std::shared_ptr<Shared> st_;
  std::vector<std::shared_ptr<Slot>> slots_;
  int64_t parallelism_ = 1;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto in, MakeNodeIterator(a->inputs[0], ctx));
  const int64_t n = a->node->interleave().num_parallel_calls();
  if (n == 0 || n == 1) {
    return std::unique_ptr<Iterator>(new InterleaveIterator(std::move(a), std::move(in), ctx));
  }
  return std::unique_ptr<Iterator>(
      new ParallelInterleaveIterator(std::move(a), std::move(in), ctx));
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
