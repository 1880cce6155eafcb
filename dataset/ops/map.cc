// Map(fn, num_parallel_calls, deterministic): fn applied to each element,
// up to num_parallel_calls calls at once on the process-wide pool.
#include <chrono>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Map"));
  SLUICE_RETURN_IF_ERROR(CheckParallelCalls("Map", a.node->map().num_parallel_calls()));
  SLUICE_ASSIGN_OR_RETURN(a.fn, CompiledFunction::Compile(a.node->map().fn(), in->spec, "Map"));
  a.spec = a.fn->output_spec();
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

// The next input element through `fn`, on this thread.
Result ApplyNext(Iterator& in, const CompiledFunction& fn, ElementSeeder& seeder) {
  SLUICE_ASSIGN_OR_RETURN(auto e, in.Next());
  if (!e) return End();
  const uint64_t seed = fn.random() ? seeder.SeedFor(in.ElementKey()) : 0;
  SLUICE_ASSIGN_OR_RETURN(Element out, fn.Apply(*e, seed));
  return Some(std::move(out));
}

class MapIterator : public ForwardingIterator {
 public:
  MapIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : ForwardingIterator(std::move(a), std::move(in)), seeder_(ctx, *a_) {}
  Result Next() override { return ApplyNext(*in_, *a_->fn, seeder_); }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {seeder_.untracked()});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {seeder_.untracked_position()});
  }

 private:
  ElementSeeder seeder_;
};

// kAutotune: calls cheaper than this on average run on the consumer's
// thread, where handing them to the pool would cost more than they do.
constexpr int64_t kInlineBelowNs = 20'000;
// Nondeterministic: how long the consumer waits for a pool thread to finish
// a call before it runs a queued one itself.
constexpr absl::Duration kNondeterministicPatience = absl::Milliseconds(2);
// kAutotune decides after this many calls.
constexpr int64_t kAutotuneSampleCalls = 16;

// Parallel Map. The consumer's thread pulls the input (so input iterators
// stay single-threaded) and keeps up to `parallelism` calls in flight on
// the pool; it runs a call itself when no pool thread has taken it yet.
// Memory: at most `parallelism` input elements and results held
// (num_parallel_calls, or twice the pool's threads under kAutotune).
// The destructor cancels calls not yet started and waits for running ones.
//
// Reading distributed_epoch splits (ctx.splits, on a worker) and
// deterministic, it is a read-ahead op (SplitPassing::kReadsAhead): a
// thread of its own pulls the input instead, so that the consumer drains
// the calls while that thread waits for a split at the epoch's end (the
// epoch ends only once the elements read ahead left the pipeline); each
// call keeps its element's split, held (SplitSource::ReadAhead) until the
// consumer asks for the element after it.
class ParallelMapIterator : public UnaryIterator {
 public:
  ParallelMapIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : UnaryIterator(std::move(a), std::move(in)), st_(std::make_shared<Shared>()),
        seeder_(ctx, *a_), splits_(a_->node->map().nondeterministic() ? nullptr : ctx.splits) {
    const auto& m = node().map();
    autotune_ = m.num_parallel_calls() == kAutotune;
    // kAutotune keeps twice the pool's threads in flight, so no thread
    // idles while the consumer takes a result.
    parallelism_ = ResolveParallelism(m.num_parallel_calls()) * (autotune_ ? 2 : 1);
    deterministic_ = !m.nondeterministic();
    st_->fn = a_->fn;
  }
  ~ParallelMapIterator() override {
    st_->cancelled.store(true);
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (reader_.joinable()) reader_.join();
    absl::MutexLock l(&mu_);
    for (auto& c : window_) c->task->Wait();  // a queued call returns at once now
    if (splits_ != nullptr) {  // what it held is dropped
      splits_->Released(split_);
      for (auto& c : window_) splits_->Released(c->split);
    }
  }

  // Once kAutotune chose to run calls here, what is in flight is delivered
  // first, then the input is mapped on this thread.
  Result Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!restored_.empty()) {  // results saved in a checkpoint come first
      key_ = restored_.front().second;
      Element e = std::move(restored_.front().first);
      restored_.pop_front();
      return Some(std::move(e));
    }
    if (splits_ != nullptr) return NextFromReader();
    if (!inline_) Fill();
    std::shared_ptr<Call> call;
    bool here;  // inline, once the calls in flight were delivered
    {
      absl::MutexLock l(&mu_);
      if (window_.empty() && (!inline_ || input_done_)) return Finish();
      here = window_.empty();
      if (!here && deterministic_) call = window_.front();
    }
    if (here) {
      Result r = ApplyNext(*in_, *a_->fn, seeder_);
      key_ = in_->ElementKey();
      return r;
    }
    if (deterministic_) {
      call->task->Wait();
      absl::MutexLock l(&mu_);
      window_.pop_front();
    } else {
      call = TakeAnyDone();
    }
    Result r = std::move(call->result);
    key_ = call->key;
    if (!r.ok()) Stop();
    if (autotune_ && !decided_) Autotune();
    return r;
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  int64_t ElementSplit() const override { return split_; }
  // The calls in flight are waited for and saved as their results (the
  // input's position is past their elements), with the input's end or
  // error when it was reached.
  absl::Status SaveState(proto::IteratorState* state) const override ABSL_LOCKS_EXCLUDED(mu_) {
    if (splits_ != nullptr) {
      return absl::FailedPreconditionError(
          "Map: a parallel Map reading distributed_epoch splits saves no position (a service "
          "checkpoint keeps the splits delivered instead)");
    }
    SLUICE_RETURN_IF_ERROR(SaveValues(state, {seeder_.untracked()}));
    absl::MutexLock l(&mu_);
    std::vector<HeldResult> results;
    for (const auto& c : window_) {
      c->task->Wait();
      results.push_back({c->result, c->key});
    }
    if (input_done_) results.push_back({input_end_.ok() ? End() : Result(input_end_), {}});
    std::vector<HeldResult> earlier;  // restored, not yet delivered
    for (const auto& [e, key] : restored_) earlier.push_back({Some(e), key});
    std::vector<const HeldResult*> held;
    for (const HeldResult& h : earlier) held.push_back(&h);
    for (const HeldResult& h : results) held.push_back(&h);
    SLUICE_RETURN_IF_ERROR(SaveHeld(held, state));
    if (input_done_) {  // the input is done with
      state->add_inputs()->set_op(kEndedState);
      return absl::OkStatus();
    }
    return in_->SaveState(state->add_inputs());
  }
  absl::Status RestoreState(const proto::IteratorState& state) override ABSL_LOCKS_EXCLUDED(mu_) {
    SLUICE_RETURN_IF_ERROR(CheckState(state, state.values_size(), 1));
    if (state.values_size() < 1) return CorruptCheckpoint("Map saved no seeder position");
    *seeder_.untracked_position() = state.values(0);
    SLUICE_ASSIGN_OR_RETURN(std::vector<HeldResult> held, RestoreHeld(state, 1));
    absl::MutexLock l(&mu_);
    for (HeldResult& h : held) {
      if (h.result.ok() && h.result->has_value()) {
        restored_.emplace_back(std::move(**h.result), h.key);
      } else {  // the input's end or error, after the results before it
        input_done_ = true;
        input_end_ = h.result.ok() ? absl::OkStatus() : h.result.status();
      }
    }
    return in_->RestoreState(state.inputs(0));
  }

 private:
  struct Shared {
    std::shared_ptr<const CompiledFunction> fn;
    std::atomic<bool> cancelled{false};
    std::atomic<int64_t> calls{0}, call_ns{0};
    // What a consumer waiting for a call to finish waits on: a call sets
    // its Call::finished while holding it, so Await sees the change.
    absl::Mutex mu;
  };
  struct Call {
    std::shared_ptr<PoolTask> task;
    std::optional<uint64_t> key;  // the input element's
    int64_t split = -1;           // and its split, with the input thread
    Result result;  // written by whoever runs the task, read once it finished
    // The call's last touch of this Call: stored (release, under
    // Shared::mu) after `result`, so a reader that loads true (acquire)
    // sees the result.
    std::atomic<bool> finished{false};
  };

  // A call of fn on the input element just read (`e`), scheduled (or, with
  // `here`, run on this thread).
  std::shared_ptr<Call> StartCall(Element e, bool here = false) {
    auto call = std::make_shared<Call>();
    call->key = in_->ElementKey();
    if (splits_ != nullptr) call->split = in_->ElementSplit();
    const uint64_t seed = a_->fn->random() ? seeder_.SeedFor(call->key) : 0;
    call->task = std::make_shared<PoolTask>(
        [st = st_, call = call.get(), element = std::move(e), seed] {
          if (st->cancelled.load()) {
            call->result = absl::CancelledError("Map: the iterator was destroyed");
          } else {
            const auto start = std::chrono::steady_clock::now();
            auto out = st->fn->Apply(element, seed);
            st->call_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - start).count();
            st->calls++;
            call->result = out.ok() ? Some(*std::move(out)) : Result(out.status());
          }
          absl::MutexLock l(&st->mu);
          call->finished.store(true, std::memory_order_release);
        });
    if (here) {
      call->task->TryRun();
    } else {
      Schedule(call->task);
    }
    return call;
  }

  // The input's end (or error): reached once Next returned terminal.
  void InputEndedLocked(const Result& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    input_done_ = true;
    input_end_ = e.ok() ? absl::OkStatus() : e.status();
  }

  // On the consumer's thread (no input thread).
  void Fill() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      {
        absl::MutexLock l(&mu_);
        if (input_done_ || static_cast<int64_t>(window_.size()) >= parallelism_) return;
      }
      Result e = in_->Next();
      absl::MutexLock l(&mu_);
      if (!e.ok() || !e->has_value()) return InputEndedLocked(e);
      window_.push_back(StartCall(std::move(**e)));
    }
  }

  // The input thread (reading splits): keeps `parallelism_` calls in the
  // window; each call's split is held from here until released. Once
  // kAutotune chose to run calls inline, it runs them itself.
  void Read() ABSL_LOCKS_EXCLUDED(mu_) {
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || static_cast<int64_t>(window_.size()) < parallelism_;
    };
    while (true) {
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(&room));
        if (stop_) return;
      }
      Result e = in_->Next();
      if (!e.ok() || !e->has_value()) {
        absl::MutexLock l(&mu_);
        return InputEndedLocked(e);
      }
      splits_->ReadAhead(in_->ElementSplit());
      std::shared_ptr<Call> call = StartCall(std::move(**e), inline_);
      if (autotune_ && !decided_) Autotune();
      absl::MutexLock l(&mu_);
      window_.push_back(std::move(call));
    }
  }

  Result NextFromReader() ABSL_LOCKS_EXCLUDED(mu_) {
    splits_->Released(std::exchange(split_, -1));
    if (!reader_.joinable()) reader_ = std::thread([this] { Read(); });
    std::shared_ptr<Call> call;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !window_.empty() || input_done_;
      };
      mu_.Await(absl::Condition(&ready));
      if (window_.empty()) return Finish();
      call = window_.front();
      window_.pop_front();  // room for the next call
    }
    call->task->Wait();
    split_ = call->split;
    key_ = call->key;
    Result r = std::move(call->result);
    if (!r.ok()) {  // nothing after it is delivered
      absl::MutexLock l(&mu_);
      stop_ = true;
      st_->cancelled.store(true);
      InputEndedLocked(End());
    }
    return r;
  }

  // Nondeterministic: the first call in the window that finished, else
  // one no pool thread took (run here), else the next to finish.
  std::shared_ptr<Call> TakeAnyDone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock window_lock(&mu_);
    auto take = [this](std::deque<std::shared_ptr<Call>>::iterator it)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto call = *it;
      window_.erase(it);
      return call;
    };
    auto any_finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& c : window_) {
        if (c->finished.load(std::memory_order_acquire)) return true;
      }
      return false;
    };
    while (true) {
      {
        // Pool threads get a moment first: a call run here is delivered
        // when it ends, even if others finish sooner.
        absl::MutexLock l(&st_->mu);
        st_->mu.AwaitWithTimeout(absl::Condition(&any_finished), kNondeterministicPatience);
        for (auto it = window_.begin(); it != window_.end(); ++it) {
          if ((*it)->finished.load(std::memory_order_acquire)) return take(it);
        }
      }
      // From the back: the pool takes calls from the front.
      for (auto it = window_.rbegin(); it != window_.rend(); ++it) {
        if ((*it)->task->TryRun()) return take(std::next(it).base());
      }
      absl::MutexLock l(&st_->mu);
      st_->mu.Await(absl::Condition(&any_finished));
    }
  }

  // The input's end (or error) once every call before it was delivered.
  Result Finish() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!input_end_.ok()) return input_end_;
    return End();
  }

  // After an error: nothing later is delivered (no input thread).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    st_->cancelled.store(true);
    absl::MutexLock l(&mu_);
    for (auto& c : window_) c->task->Wait();
    window_.clear();
    InputEndedLocked(End());
  }

  // The consumer's thread decides, or the input thread when there is one.
  void Autotune() {
    if (st_->calls.load() < kAutotuneSampleCalls) return;
    decided_ = true;
    if (st_->call_ns.load() / st_->calls.load() < kInlineBelowNs) inline_ = true;
  }

  std::shared_ptr<Shared> st_;
  ElementSeeder seeder_;  // the input reader's
  // Non-null: reading distributed_epoch splits, through the input thread.
  SplitSource* const splits_;
  // Results from a checkpoint (with their keys), delivered first.
  std::deque<std::pair<Element, std::optional<uint64_t>>> restored_;
  std::optional<uint64_t> key_;  // of the element last returned
  int64_t split_ = -1;           // and its split, held until the next Next()
  // The calls in flight, in input order; with the input thread, shared
  // with it (otherwise the consumer's alone, locked all the same).
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Call>> window_ ABSL_GUARDED_BY(mu_);
  bool input_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status input_end_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // the input thread returns
  std::thread reader_;
  int64_t parallelism_ = 1;
  bool deterministic_ = true;
  bool autotune_ = false, decided_ = false, inline_ = false;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(AnalysisPtr a, const IteratorContext& ctx) {
  const int64_t n = a->node->map().num_parallel_calls();
  if (n == 0 || n == 1) return MakeUnaryIterator<MapIterator>(std::move(a), ctx);
  return MakeUnaryIterator<ParallelMapIterator>(std::move(a), ctx);
}

// A parallel Map reads ahead of its output, across split boundaries: a
// deterministic one keeps each element's split (a read-ahead op); a
// nondeterministic one reorders, and distributed_epoch cannot tie its
// output to splits.
SplitPassing SplitPassingOf(const proto::DatasetNode& n) {
  const auto& m = n.map();
  const bool parallel = m.num_parallel_calls() != 0 && m.num_parallel_calls() != 1;
  if (!parallel) return SplitPassing::kTracked;
  return m.nondeterministic() ? SplitPassing::kUntracked : SplitPassing::kReadsAhead;
}

}  // namespace

extern const OpDef kMapOp = {
    .name = "Map",
    .inputs = &InputField<&proto::DatasetNode::map>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_map>,
    .analyze = &Analyze,
    .make_iterator = &MakeIterator,
    .split_passing = SplitPassing::kTracked,
    .split_passing_of = &SplitPassingOf,
};

}  // namespace sluice::internal
