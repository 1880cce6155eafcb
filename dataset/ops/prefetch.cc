// Prefetch(buffer_size): the input produced up to buffer_size elements
// ahead on a background thread. kAutotune: max(2, pool threads) elements,
// and no more than kAutotuneBytes of them beyond the first.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

constexpr size_t kAutotuneBytes = size_t{64} << 20;

size_t ByteSize(const Result& r) {
  size_t n = 0;
  if (r.ok() && r->has_value()) {
    for (const Tensor& t : **r) n += t.byte_size();
  }
  return n;
}

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Prefetch"));
  if (a.node->prefetch().buffer_size() <= 0 && a.node->prefetch().buffer_size() != kAutotune) {
    return Invalid("Prefetch", absl::StrCat("buffer_size must be > 0 or kAutotune; got ",
                                            a.node->prefetch().buffer_size()));
  }
  a.spec = in->spec;
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

// Threads: the consumer calls Next(); the producer thread (started by the
// first Next(), joined by the destructor) is the only caller of in_->Next().
// Under distributed_epoch it keeps each element's split and tells the
// split source which it holds (SplitPassing::kReadsAhead).
class PrefetchIterator : public UnaryIterator {
 public:
  PrefetchIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : UnaryIterator(std::move(a), std::move(in)), splits_(ctx.splits) {}
  ~PrefetchIterator() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    if (splits_ != nullptr) {  // what it held is dropped
      splits_->Released(split_);
      absl::MutexLock l(&mu_);
      for (int64_t s : buf_splits_) splits_->Released(s);
    }
  }
  Result Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    if (splits_ != nullptr) splits_->Released(std::exchange(split_, -1));
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](std::deque<HeldResult>* b) { return !b->empty(); }, &buf_));
    Result r = buf_.front().result;
    key_ = buf_.front().key;
    // The terminal result (end or error) stays queued so it repeats.
    if (r.ok() && r->has_value()) {
      bytes_ -= ByteSize(buf_.front().result);
      buf_.pop_front();
      if (splits_ != nullptr) {
        split_ = buf_splits_.front();
        buf_splits_.pop_front();
      }
    }
    return r;
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  int64_t ElementSplit() const override { return split_; }

  // The producer is held between elements meanwhile: the buffer (as data)
  // and the input's position then agree.
  absl::Status SaveState(proto::IteratorState* state) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    pause_ = true;
    mu_.Await(absl::Condition(
        +[](bool* producing) { return !*producing; }, &producing_));
    absl::Status s = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      SLUICE_RETURN_IF_ERROR(BeginSave(state));
      std::vector<const HeldResult*> held;
      for (const HeldResult& h : buf_) held.push_back(&h);
      SLUICE_RETURN_IF_ERROR(SaveHeld(held, state));
      if (!buf_.empty() && Terminal(buf_.back())) {  // the input is done with
        state->add_inputs()->set_op(kEndedState);
        return absl::OkStatus();
      }
      return in_->SaveState(state->add_inputs());
    }();
    pause_ = false;
    return s;
  }
  absl::Status RestoreState(const proto::IteratorState& state) override ABSL_LOCKS_EXCLUDED(mu_) {
    SLUICE_RETURN_IF_ERROR(CheckState(state, state.values_size(), 1));
    SLUICE_ASSIGN_OR_RETURN(std::vector<HeldResult> held, RestoreHeld(state, 0));
    SLUICE_RETURN_IF_ERROR(in_->RestoreState(state.inputs(0)));
    absl::MutexLock l(&mu_);
    for (HeldResult& h : held) {
      bytes_ += ByteSize(h.result);
      if (splits_ != nullptr && !Terminal(h)) buf_splits_.push_back(-1);
      buf_.push_back(std::move(h));
    }
    return absl::OkStatus();
  }

 private:
  static bool Terminal(const HeldResult& h) { return !h.result.ok() || !h.result->has_value(); }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    const bool autotune = node().prefetch().buffer_size() == kAutotune;
    const size_t cap = autotune ? static_cast<size_t>(std::max(2, ThreadPoolSize()))
                                : static_cast<size_t>(node().prefetch().buffer_size());
    const size_t max_bytes = autotune ? kAutotuneBytes : SIZE_MAX;
    auto has_room = [this, cap, max_bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (!pause_ && (buf_.empty() || (buf_.size() < cap && bytes_ < max_bytes)));
    };
    while (true) {
      {
        absl::MutexLock l(&mu_);
        // A restored buffer may already hold the end.
        if (!buf_.empty() && Terminal(buf_.back())) return;
        mu_.Await(absl::Condition(&has_room));
        if (stop_) return;
        producing_ = true;
      }
      HeldResult item{in_->Next(), std::nullopt};
      bool terminal = Terminal(item);
      if (!terminal) item.key = in_->ElementKey();
      const int64_t split = !terminal && splits_ != nullptr ? in_->ElementSplit() : -1;
      if (split >= 0) splits_->ReadAhead(split);
      absl::MutexLock l(&mu_);
      producing_ = false;
      bytes_ += ByteSize(item.result);
      buf_.push_back(std::move(item));
      if (!terminal && splits_ != nullptr) buf_splits_.push_back(split);
      if (terminal) return;
    }
  }

  mutable absl::Mutex mu_;
  std::deque<HeldResult> buf_ ABSL_GUARDED_BY(mu_);
  // With splits_: the split of each element in buf_, held (ReadAhead)
  // until released; split_ is the consumer's, of the element last returned.
  SplitSource* const splits_;
  std::deque<int64_t> buf_splits_ ABSL_GUARDED_BY(mu_);
  int64_t split_ = -1;
  std::optional<uint64_t> key_;  // the consumer's: of the element last returned
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Save holds the producer between elements (pause_) once it is outside
  // the input (producing_ false).
  mutable bool pause_ ABSL_GUARDED_BY(mu_) = false;
  mutable bool producing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

extern const OpDef kPrefetchOp = {
    .name = "Prefetch",
    .inputs = &InputField<&proto::DatasetNode::prefetch>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_prefetch>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<PrefetchIterator>,
    .split_passing = SplitPassing::kReadsAhead,
};

}  // namespace sluice::internal
