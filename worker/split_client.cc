#include "sluice/worker/split_client.h"

#include "absl/strings/str_cat.h"
#include "sluice/rpc/grpc_util.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {
namespace {

constexpr absl::Duration kLongPoll = absl::Milliseconds(200);
constexpr absl::Duration kRetry = absl::Milliseconds(100);

// Worth a retry: the dispatcher unreachable or restarting. CANCELLED counts:
// this client only cancels its own calls when stopping (checked first), so
// a CANCELLED is a dispatcher that shut down with the call in flight (a
// graceful restart cancels the long polls it holds).
bool Transient(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

}  // namespace

SplitClient::SplitClient(proto::DispatcherService::Stub* stub, std::string worker_address,
                         int64_t task_id, bool tracked, int prefetch)
    : stub_(stub),
      worker_address_(std::move(worker_address)),
      task_id_(task_id),
      tracked_(tracked),
      prefetch_(static_cast<size_t>(std::max(1, prefetch))) {
  fetcher_ = std::thread([this] { FetchLoop(); });
  reporter_ = std::thread([this] { ReportLoop(); });
}

SplitClient::~SplitClient() { Stop(); }

void SplitClient::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    for (grpc::ClientContext* c : calls_) c->TryCancel();
  }
  if (fetcher_.joinable()) fetcher_.join();
  if (reporter_.joinable()) reporter_.join();
}

grpc::Status SplitClient::Call(const proto::GetSplitRequest& req, proto::GetSplitResponse* resp,
                               absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  {
    absl::MutexLock l(&mu_);
    if (stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    calls_.insert(&ctx);
  }
  grpc::Status s = stub_->GetSplit(&ctx, req, resp);
  absl::MutexLock l(&mu_);
  calls_.erase(&ctx);
  return s;
}

void SplitClient::PauseLocked() {
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopped), kRetry);
}

int64_t SplitClient::BeginEpoch() {
  absl::MutexLock l(&mu_);
  return began_++;
}

void SplitClient::FinishReadingLocked() {
  if (!current_) return;
  const int64_t id = *current_;
  current_.reset();
  read_.insert(id);
  MaybeCompleteLocked(id);
}

void SplitClient::MaybeCompleteLocked(int64_t split_id, bool timed_out) {
  if (!read_.count(split_id)) return;
  auto e = elements_.find(split_id);
  // Elements read ahead are still inside the pipeline: more of the split's
  // output may come.
  if (e != elements_.end() && e->second.read_ahead > 0) return;
  if (e != elements_.end() && e->second.acked < e->second.tagged) {
    if (!timed_out) return;
    unacknowledged_ += e->second.sent - e->second.acked;
    spdlog::warn("worker {}: task {}: {} element(s) of split {} were sent but not acknowledged "
                 "within {}; counting them delivered (their client left or is unreachable)",
                 worker_address_, task_id_, e->second.sent - e->second.acked, split_id,
                 absl::FormatDuration(kAckTimeout));
  }
  if (e != elements_.end()) elements_.erase(e);
  read_.erase(split_id);
  completed_.push_back(split_id);
}

int64_t SplitClient::elements_unacknowledged() const {
  absl::MutexLock l(&mu_);
  return unacknowledged_;
}

absl::StatusOr<std::optional<Split>> SplitClient::Next(int64_t epoch) {
  absl::MutexLock l(&mu_);
  FinishReadingLocked();
  if (epoch != epoch_) {
    // A new repetition of the source; the previous one was read to its end.
    epoch_ = epoch;
    ended_ = false;
    queue_.clear();
  }
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !error_.ok() || !queue_.empty() || ended_;
  };
  mu_.Await(absl::Condition(&ready));
  if (!error_.ok()) return error_;
  if (stop_) return absl::CancelledError(absl::StrCat("task ", task_id_, " was stopped"));
  if (queue_.empty()) return std::optional<Split>();
  Split s = std::move(queue_.front());
  queue_.pop_front();
  current_ = s.id;
  if (tracked_) {
    SplitElements& e = elements_[s.id];
    e.range.epoch = s.epoch;
    e.range.begin = s.begin;
    e.range.end = s.end;
    e.range.split_id = s.id;
    e.skip = s.skip;
  }
  return std::optional<Split>(std::move(s));
}

bool SplitClient::EpochHadSplits(int64_t epoch) {
  absl::MutexLock l(&mu_);
  auto it = had_splits_.find(epoch);
  return it != had_splits_.end() && it->second;
}

SplitClient::Tagged SplitClient::Tag(int64_t split) {
  absl::MutexLock l(&mu_);
  Tagged t;
  if (!tracked_ || split < 0) return t;
  auto it = elements_.find(split);
  if (it == elements_.end()) return t;
  SplitElements& e = it->second;
  t.position = e.range;
  t.position.index = e.tagged++;
  if (e.skip.Contains(t.position.index)) {
    // Delivered before the checkpoint this split resumes from.
    t.skip = true;
    ++e.sent;
    ++e.acked;
  }
  return t;
}

void SplitClient::ReadAhead(int64_t split) {
  if (split < 0) return;
  absl::MutexLock l(&mu_);
  auto it = elements_.find(split);
  if (!tracked_ || it == elements_.end()) return;
  ++it->second.read_ahead;
}

void SplitClient::Released(int64_t split) {
  if (split < 0) return;
  absl::MutexLock l(&mu_);
  auto it = elements_.find(split);
  if (!tracked_ || it == elements_.end() || it->second.read_ahead == 0) return;
  --it->second.read_ahead;
  MaybeCompleteLocked(split);
}

void SplitClient::Sent(int64_t split_id) {
  if (split_id < 0) return;
  absl::MutexLock l(&mu_);
  auto e = elements_.find(split_id);
  if (e == elements_.end()) return;
  ++e->second.sent;
  e->second.last_sent = absl::Now();
}

void SplitClient::Acked(int64_t split_id, int64_t count) {
  if (split_id < 0 || count <= 0) return;
  absl::MutexLock l(&mu_);
  auto e = elements_.find(split_id);
  if (e == elements_.end()) return;  // completed, or not this task's
  // An ack beyond what was sent (a resent request) counts only what was.
  e->second.acked = std::min(e->second.sent, e->second.acked + count);
  MaybeCompleteLocked(split_id);
}

void SplitClient::FetchLoop() {
  int failures = 0;
  while (true) {
    proto::GetSplitRequest req;
    {
      absl::MutexLock l(&mu_);
      auto want = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (error_.ok() && epoch_ >= 0 && !ended_ && queue_.size() < prefetch_);
      };
      mu_.Await(absl::Condition(&want));
      if (stop_) return;
      req.set_epoch(epoch_);
      for (int64_t id : held_) req.add_held_splits(id);
      req.set_reports_held(true);
    }
    req.set_worker_address(worker_address_);
    req.set_task_id(task_id_);
    req.set_wait_ms(absl::ToInt64Milliseconds(kLongPoll));
    proto::GetSplitResponse resp;
    grpc::Status s = Call(req, &resp, kLongPoll + absl::Seconds(10));
    absl::MutexLock l(&mu_);
    if (stop_) return;
    if (!s.ok()) {
      if (Transient(s)) {
        if (failures++ % 20 == 0) {
          spdlog::warn("worker {}: GetSplit for task {} failed ({}); retrying", worker_address_,
                       task_id_, s.error_message());
        }
        PauseLocked();
        continue;
      }
      error_ = FromGrpcStatus(s, absl::StrCat("GetSplit for task ", task_id_));
      return;
    }
    failures = 0;
    if (req.epoch() != epoch_) continue;  // the source moved on meanwhile
    if (resp.has_split()) {
      Split sp;
      sp.id = resp.split().split_id();
      sp.begin = resp.split().begin();
      sp.end = resp.split().end();
      sp.epoch = resp.split().epoch();
      sp.skip = IndexSet(resp.split().skip_prefix(), resp.split().skip());
      sp.files.assign(resp.split().files().begin(), resp.split().files().end());
      if (sp.files.empty() && !resp.split().file().empty()) sp.files.push_back(resp.split().file());
      held_.insert(sp.id);
      queue_.push_back(std::move(sp));
    } else if (resp.end_of_splits()) {
      ended_ = true;
      had_splits_[epoch_] = resp.epoch_had_splits();
    }
    // not_ready: the dispatcher already waited; ask again.
  }
}

void SplitClient::ReportLoop() {
  int failures = 0;
  while (true) {
    proto::GetSplitRequest req;
    {
      absl::MutexLock l(&mu_);
      auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !completed_.empty();
      };
      while (!mu_.AwaitWithTimeout(absl::Condition(&have), kAckTimeout / 4)) {
        // Splits whose sent elements no client acknowledged in time.
        const absl::Time now = absl::Now();
        std::vector<int64_t> overdue;
        for (int64_t id : read_) {
          auto e = elements_.find(id);
          if (e != elements_.end() && e->second.sent == e->second.tagged &&
              now - e->second.last_sent > kAckTimeout) {
            overdue.push_back(id);
          }
        }
        for (int64_t id : overdue) MaybeCompleteLocked(id, /*timed_out=*/true);
      }
      if (stop_) return;
      for (int64_t id : completed_) req.add_completed_splits(id);
      completed_.clear();
    }
    req.set_worker_address(worker_address_);
    req.set_task_id(task_id_);
    req.set_report_only(true);
    proto::GetSplitResponse resp;
    grpc::Status s = Call(req, &resp, absl::Seconds(10));
    absl::MutexLock l(&mu_);
    if (s.ok() || !Transient(s)) {
      // Reported (or the dispatcher forgot the task: nothing left to report).
      for (int64_t id : req.completed_splits()) held_.erase(id);
      failures = 0;
      continue;
    }
    if (stop_) return;
    completed_.insert(completed_.end(), req.completed_splits().begin(),
                      req.completed_splits().end());
    if (failures++ % 20 == 0) {
      spdlog::warn("worker {}: reporting splits of task {} failed ({}); retrying",
                   worker_address_, task_id_, s.error_message());
    }
    PauseLocked();
  }
}

}  // namespace sluice::internal
