#include "sluice/worker/task_runner.h"

#include "absl/strings/str_cat.h"
#include "sluice/rpc/protocol.h"
#include "sluice/core/frame.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

TaskRunner::TaskRunner(proto::TaskDef def, int64_t buffer_elements, FrameAllocator allocator,
                       std::function<void()> bind_thread, std::unique_ptr<SplitClient> splits)
    : def_(std::move(def)),
      // A coordinated round takes num_consumers elements at once.
      capacity_(static_cast<size_t>(
          std::max<int64_t>({1, buffer_elements, def_.num_consumers()}))),
      allocator_(std::move(allocator)),
      splits_(std::move(splits)) {
  {
    absl::MutexLock l(&mu_);  // sized once: GetRound keeps references across waits
    taken_rounds_.resize(static_cast<size_t>(std::max<int64_t>(0, def_.num_consumers())));
  }
  producer_ = std::thread([this, bind_thread = std::move(bind_thread)] {
    if (bind_thread) bind_thread();
    Produce();
  });
}

TaskRunner::~TaskRunner() {
  Stop();
  if (producer_.joinable()) producer_.join();
}

void TaskRunner::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (splits_) splits_->Stop();  // wakes a source waiting for a split
}

void TaskRunner::Produce() {
  auto fail = [this](absl::Status s) {
    absl::MutexLock l(&mu_);
    error_ = std::move(s);
  };
  proto::DatasetDef def = def_.dataset();
  if (std::optional<StaticSharding> sharding = StaticShardingOf(def_.processing_mode())) {
    auto sharded = ApplyStaticSharding(def, *sharding, def_.num_shards(), def_.worker_index());
    if (!sharded.ok()) {
      spdlog::warn("worker: task {} cannot shard its dataset: {}", def_.task_id(),
                   std::string(sharded.status().message()));
      return fail(sharded.status());
    }
    def = *std::move(sharded);
  }
  auto ds = Dataset::FromDef(def);
  if (!ds.ok()) {
    spdlog::warn("worker: task {} cannot build its dataset: {}", def_.task_id(),
                 std::string(ds.status().message()));
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the dataset does not validate on the worker: ", ds.status().message())));
  }
  IteratorContext ctx;
  ctx.splits = splits_.get();
  ctx.seed = ContextSeed(def);
  auto it = MakeNodeIterator(ds->rep()->analysis, ctx);
  if (!it.ok()) return fail(it.status());
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || buffer_.size() < capacity_ ||
               (buffered_bytes_ < kSmallBufferBytes && buffer_.size() < kMaxBufferedElements);
      };
      mu_.Await(absl::Condition(&room));
      if (stop_) return;
    }
    auto e = (*it)->Next();
    if (!e.ok()) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;  // stopped while waiting for a split
      }
      // Anything else ends the task with its error, a Cancelled too: a
      // producer that just returned would leave consumers polling a task
      // that never ends.
      return fail(e.status());
    }
    if (!e->has_value()) {
      absl::MutexLock l(&mu_);
      produced_all_ = true;
      return;
    }
    SplitClient::Tagged tag;
    if (splits_) {
      tag = splits_->Tag((*it)->ElementSplit());
      if (tag.skip) continue;  // delivered before the checkpoint it resumes from
    }
    auto frame = EncodeServedFrame(**e, allocator_);
    if (!frame.ok()) return fail(frame.status());
    frame->position = tag.position;
    frame->position.key = (*it)->ElementKey();
    absl::MutexLock l(&mu_);
    buffered_bytes_ += frame->frame_size();
    buffer_.push_back(*std::move(frame));
    ++counters_.produced_elements;
  }
}

void TaskRunner::Ack(const std::vector<SplitAck>& acks) {
  if (splits_ == nullptr) return;
  for (const SplitAck& a : acks) splits_->Acked(a.split_id, a.count);
}

int64_t TaskRunner::BatchLimitLocked(const ElementRequest& request, absl::Time now) const {
  const int64_t limit = std::max<int64_t>(1, request.max_elements);
  int64_t active = 0;
  for (const auto& [id, c] : consumers_) {
    if (!c.left && (c.serving > 0 || now - c.last_seen < kConsumerIdle)) ++active;
  }
  const int64_t sharers = std::max<int64_t>(request.shared_job ? 2 : 1, active);
  if (sharers == 1) return limit;
  const int64_t share = static_cast<int64_t>(buffer_.size()) /
                        (sharers * std::max<int64_t>(1, request.max_outstanding));
  return std::clamp<int64_t>(share, 1, limit);
}

namespace {
size_t BatchBytes(const ServedBatch& b) {
  size_t bytes = 0;
  for (const FrameBuffer& f : b.frames) bytes += f.frame_size();
  return bytes;
}
}  // namespace

void TaskRunner::RetainLocked(Consumer& consumer, const ServedBatch& batch) {
  consumer.retained.push_back(batch);  // shares the frames' memory, no copy
  consumer.retained_bytes += BatchBytes(batch);
  while (consumer.retained.size() > 1 && consumer.retained_bytes > kMaxRetainedBytes) {
    consumer.retained_bytes -= BatchBytes(consumer.retained.front());
    consumer.retained.pop_front();
    consumer.retained_from = consumer.retained.front().seq;
  }
}

void TaskRunner::ForgetDeliveredLocked(Consumer& consumer, int64_t delivered_seq) {
  while (!consumer.retained.empty()) {
    const ServedBatch& b = consumer.retained.front();
    if (b.seq + static_cast<int64_t>(b.frames.size()) > delivered_seq) break;
    consumer.retained_bytes -= BatchBytes(b);
    consumer.retained.pop_front();
  }
  consumer.retained_from = std::max(
      consumer.retained_from,
      consumer.retained.empty() ? std::min(delivered_seq, consumer.next_seq)
                                : consumer.retained.front().seq);
}

void TaskRunner::LeaveLocked(Consumer& consumer) {
  std::map<int64_t, int64_t> unreceived;  // split -> elements
  for (const ServedBatch& b : consumer.retained) {
    for (size_t i = 0; i < b.frames.size(); ++i) {
      const int64_t split = b.frames[i].position.split_id;
      if (b.seq + static_cast<int64_t>(i) >= consumer.delivered && split > 0) ++unreceived[split];
    }
  }
  if (splits_) {
    for (const auto& [split, n] : unreceived) splits_->Acked(split, n);
  }
  consumer.retained.clear();
  consumer.retained_bytes = 0;
  consumer.retained_from = consumer.next_seq;
  consumer.delivered = consumer.next_seq;
  consumer.left = true;
}

std::optional<absl::StatusOr<ServedBatch>> TaskRunner::ResendLocked(
    const Consumer& consumer, const ElementRequest& request) const {
  const int64_t from = request.delivered_seq;
  if (from >= consumer.next_seq) return std::nullopt;  // nothing handed out since
  if (from < consumer.retained_from) {
    return absl::StatusOr<ServedBatch>(absl::DataLossError(absl::StrCat(
        "task ", def_.task_id(), ": elements ", from, " to ", consumer.retained_from - 1,
        " that this worker handed consumer ", request.client_id,
        " were lost in transit and are no longer kept for redelivery (a consumer's kept "
        "replies are bounded by ",
        kMaxRetainedBytes >> 20, " MiB)")));
  }
  for (const ServedBatch& b : consumer.retained) {
    const int64_t end = b.seq + static_cast<int64_t>(b.frames.size());
    if (from >= end) continue;
    ServedBatch out;
    out.resent = true;
    out.seq = from;
    const int64_t limit = std::max<int64_t>(1, request.max_elements);
    for (int64_t s = from; s < end && s - from < limit; ++s) {
      out.frames.push_back(b.frames[static_cast<size_t>(s - b.seq)]);
    }
    return absl::StatusOr<ServedBatch>(std::move(out));
  }
  return std::nullopt;
}

absl::StatusOr<ServedBatch> TaskRunner::GetBatch(const ElementRequest& request,
                                                 absl::Duration wait) {
  absl::MutexLock l(&mu_);
  Consumer& consumer = consumers_[request.client_id];  // map: the reference stays valid
  // Redelivery needs to tell consumers apart: not for anonymous ones.
  const bool redeliver = request.client_id != 0;
  if (redeliver && request.delivered_seq >= 0) {
    ForgetDeliveredLocked(consumer, request.delivered_seq);
    consumer.delivered = std::max(consumer.delivered, request.delivered_seq);
  }
  if (redeliver && (request.leaving || consumer.left)) {
    // A request sent before it left and arriving after: nothing more.
    if (!consumer.left) LeaveLocked(consumer);
    ServedBatch out;
    out.not_ready = true;
    return out;
  }
  if (redeliver && request.resend) {
    if (auto resent = ResendLocked(consumer, request)) {
      consumer.last_seen = absl::Now();
      return *std::move(resent);
    }
  }
  ++consumer.serving;
  // The end only once the consumer holds everything (see the header).
  auto at_end = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return produced_all_ && (!redeliver || consumer.HoldsAll());
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !buffer_.empty() || at_end() || !error_.ok() || consumer.left;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  --consumer.serving;
  const absl::Time now = absl::Now();
  consumer.last_seen = now;
  ServedBatch out;
  if (consumer.left) {  // it left while this request waited
    out.not_ready = true;
    return out;
  }
  if (!buffer_.empty()) {
    const int64_t max_elements = BatchLimitLocked(request, now);
    size_t bytes = 0;
    do {
      bytes += buffer_.front().frame_size();
      buffered_bytes_ -= buffer_.front().frame_size();
      out.frames.push_back(std::move(buffer_.front()));
      buffer_.pop_front();
      // Handed to the data plane; its split completes once a client
      // acknowledges it.
      if (splits_) splits_->Sent(out.frames.back().position.split_id);
    } while (!buffer_.empty() && out.frames.back().payload == nullptr &&
             buffer_.front().payload == nullptr &&
             static_cast<int64_t>(out.frames.size()) < max_elements &&
             static_cast<int64_t>(bytes + buffer_.front().frame_size()) <= request.max_bytes);
    out.seq = consumer.next_seq;
    consumer.next_seq += static_cast<int64_t>(out.frames.size());
    counters_.served_elements += static_cast<int64_t>(out.frames.size());
    counters_.served_bytes += static_cast<int64_t>(bytes);
    if (redeliver) RetainLocked(consumer, out);
    return out;
  }
  if (!error_.ok()) return error_;
  if (stop_) return absl::CancelledError(absl::StrCat("task ", def_.task_id(), " was stopped"));
  if (at_end()) {
    out.end_of_sequence = true;
    out.seq = consumer.next_seq;
    return out;
  }
  out.not_ready = true;
  return out;
}

absl::StatusOr<ServedBatch> TaskRunner::GetRound(absl::Duration wait, int64_t consumer_index,
                                                 int64_t round, int64_t delivered_round) {
  const int64_t consumers = def_.num_consumers();
  if (consumer_index < 0 || consumer_index >= consumers || round < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", def_.task_id(), ": coordinated read of consumer ", consumer_index, " round ",
        round, "; expected consumer_index in [0, ", consumers, ") and round >= 0"));
  }
  absl::MutexLock l(&mu_);
  ServedBatch out;
  // Redelivery: forget what the consumer holds; answer a round it took
  // again with the same element.
  TakenRounds& taken = taken_rounds_[consumer_index];
  while (!taken.frames.empty() && taken.frames.begin()->first < delivered_round) {
    taken.bytes -= taken.frames.begin()->second.frame_size();
    taken.frames.erase(taken.frames.begin());
  }
  taken.forgotten.erase(taken.forgotten.begin(), taken.forgotten.lower_bound(delivered_round));
  if (auto again = taken.frames.find(round); again != taken.frames.end()) {
    out.frames.push_back(again->second);
    out.resent = true;
    return out;
  }
  if (taken.forgotten.count(round)) {
    return absl::DataLossError(absl::StrCat(
        "task ", def_.task_id(), ": consumer ", consumer_index, " asked again for round ", round,
        ", which it took but had not acknowledged, and the worker forgot it: over ",
        kMaxRetainedBytes >> 20, " MiB of its rounds were unacknowledged"));
  }
  auto take = [&](std::vector<std::optional<FrameBuffer>>& slots)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<ServedBatch> {
    std::optional<FrameBuffer>& slot = slots[consumer_index];
    if (!slot) {
      return absl::FailedPreconditionError(absl::StrCat(
          "task ", def_.task_id(), ": consumer ", consumer_index, " asked for round ", round,
          " twice"));
    }
    out.frames.push_back(*std::move(slot));
    slot.reset();
    taken.bytes += out.frames.back().frame_size();
    taken.frames.emplace(round, out.frames.back());
    while (taken.bytes > kMaxRetainedBytes && taken.frames.size() > 1) {
      taken.forgotten.insert(taken.frames.begin()->first);
      if (taken.forgotten.size() > kClosedRoundsKept) taken.forgotten.erase(taken.forgotten.begin());
      taken.bytes -= taken.frames.begin()->second.frame_size();
      taken.frames.erase(taken.frames.begin());
    }
    ++counters_.served_elements;
    counters_.served_bytes += static_cast<int64_t>(out.frames.back().frame_size());
    bool all_taken = std::none_of(slots.begin(), slots.end(),
                                  [](const auto& s) { return s.has_value(); });
    if (all_taken) {
      rounds_.erase(round);
      closed_rounds_.insert(round);
      if (closed_rounds_.size() > kClosedRoundsKept) closed_rounds_.erase(closed_rounds_.begin());
    }
    return std::move(out);
  };
  auto already_closed = [&] {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", def_.task_id(), ": round ", round, " was already served to every consumer"));
  };
  auto open = rounds_.find(round);
  if (open != rounds_.end()) return take(open->second);
  if (closed_rounds_.count(round)) return already_closed();
  // Open the round once num_consumers elements are ready and a round slot
  // is free. Requests may arrive out of round order (a consumer has several
  // rounds in flight): a round below an open one always opens, or the
  // consumers holding the open ones could wait for each other.
  auto has_slot = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return rounds_.size() < kMaxOpenRounds || round < rounds_.rbegin()->first;
  };
  auto can_open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !error_.ok() || rounds_.count(round) ||
           (has_slot() && (buffer_.size() >= static_cast<size_t>(consumers) || produced_all_));
  };
  mu_.AwaitWithTimeout(absl::Condition(&can_open), wait);
  open = rounds_.find(round);  // another consumer's request opened it meanwhile
  if (open != rounds_.end()) return take(open->second);
  if (!error_.ok()) return error_;
  if (stop_) return absl::CancelledError(absl::StrCat("task ", def_.task_id(), " was stopped"));
  if (closed_rounds_.count(round)) return already_closed();
  if (!has_slot() || buffer_.size() < static_cast<size_t>(consumers)) {
    if (produced_all_ && has_slot()) {
      out.end_of_sequence = true;
    } else {
      out.not_ready = true;
    }
    return out;
  }
  std::vector<std::optional<FrameBuffer>> slots(consumers);
  for (auto& slot : slots) {
    buffered_bytes_ -= buffer_.front().frame_size();
    slot = std::move(buffer_.front());
    buffer_.pop_front();
  }
  return take(rounds_.emplace(round, std::move(slots)).first->second);
}

bool TaskRunner::finished() const {
  absl::MutexLock l(&mu_);
  if (!error_.ok()) return true;
  if (stop_ || !produced_all_ || !buffer_.empty() || !rounds_.empty()) return false;
  const absl::Time now = absl::Now();
  for (const auto& [id, c] : consumers_) {
    const bool left = c.serving == 0 && now - c.last_seen >= kConsumerIdle;
    if (id != 0 && !c.HoldsAll() && !left) return false;  // a reply may be in transit
  }
  return true;
}

TaskRunner::Counters TaskRunner::counters() const {
  Counters c;
  {
    absl::MutexLock l(&mu_);
    c = counters_;
    c.buffered_elements = static_cast<int64_t>(buffer_.size());
    c.buffered_bytes = static_cast<int64_t>(buffered_bytes_);
  }
  if (splits_) c.unacknowledged_elements = splits_->elements_unacknowledged();
  return c;
}

absl::Status TaskRunner::error() const {
  absl::MutexLock l(&mu_);
  return error_;
}

}  // namespace sluice::internal
