// Prefetch(buffer_size): the input produced up to buffer_size elements
// ahead on a background thread.
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Prefetch"));
  if (a.node->prefetch().buffer_size() <= 0) {
    return Invalid("Prefetch", absl::StrCat("buffer_size must be > 0; got ",
                                            a.node->prefetch().buffer_size()));
  }
  a.spec = in->spec;
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

// Threads: the consumer calls Next(); the producer thread (started by the
// first Next(), joined by the destructor) is the only caller of in_->Next().
class PrefetchIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  ~PrefetchIterator() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  Result Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](std::deque<Result>* b) { return !b->empty(); }, &buf_));
    Result r = buf_.front();
    // The terminal result (end or error) stays queued so it repeats.
    if (r.ok() && r->has_value()) buf_.pop_front();
    return r;
  }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t cap = static_cast<size_t>(node().prefetch().buffer_size());
    auto has_room = [this, cap]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || buf_.size() < cap;
    };
    while (true) {
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(&has_room));
        if (stop_) return;
      }
      Result r = in_->Next();
      bool terminal = !r.ok() || !r->has_value();
      absl::MutexLock l(&mu_);
      buf_.push_back(std::move(r));
      if (terminal) return;
    }
  }

  absl::Mutex mu_;
  std::deque<Result> buf_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

extern const OpDef kPrefetchOp = {
    .name = "Prefetch",
    .inputs = &InputField<&proto::DatasetNode::prefetch>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_prefetch>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<PrefetchIterator>,
    .split_passing = SplitPassing::kUntracked,
};

}  // namespace sluice::internal
