#include <algorithm>

#include "absl/strings/str_cat.h"
#include "sluice/client/readers_internal.h"
#include "sluice/client/distribute.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

// ---- TaskOrder ---------------------------------------------------------------------

int64_t TaskOrder::Sent() {
  const int64_t n = sent_++;
  outstanding_.insert(n);
  return n;
}

void TaskOrder::Done(int64_t number) { outstanding_.erase(number); }

void TaskOrder::Failed(int64_t number) {
  Done(number);
  recovering_ = true;
}

bool TaskOrder::IsHeld(int64_t seq) const {
  auto it = held_.upper_bound(seq);
  if (it == held_.begin()) return false;
  --it;
  return seq < it->second.end(it->first);
}

bool TaskOrder::TakeGivenUp(int64_t seq) {
  auto it = given_up_.upper_bound(seq);
  if (it == given_up_.begin()) return false;
  --it;
  const auto [start, end] = *it;
  if (seq >= end) return false;
  given_up_.erase(it);
  if (start < seq) given_up_.emplace(start, seq);
  if (seq + 1 < end) given_up_.emplace(seq + 1, end);
  return true;
}

int64_t TaskOrder::Arrived(int64_t seq, Piece piece, std::vector<Piece>* out) {
  if (piece.elements.empty()) return 0;
  piece.positions.resize(piece.elements.size());
  if (seq < 0) {
    out->push_back(std::move(piece));
    return 0;
  }
  int64_t dropped = 0;
  Piece late;  // elements of given-up gaps: delivered now
  Piece run;   // new elements from run_start on: held
  int64_t run_start = -1;
  auto take = [&piece](size_t i, Piece* to) {
    to->elements.push_back(std::move(piece.elements[i]));
    to->positions.push_back(piece.positions[i]);
  };
  auto hold = [&] {
    if (run.elements.empty()) return;
    held_.emplace(run_start, Held{std::move(run), sent_});
    run = Piece();
  };
  for (size_t i = 0; i < piece.elements.size(); ++i) {
    const int64_t s = seq + static_cast<int64_t>(i);
    if (s < next_seq_) {
      if (TakeGivenUp(s)) {
        take(i, &late);
      } else {
        ++dropped;
      }
    } else if (IsHeld(s)) {
      hold();
      ++dropped;
    } else {
      if (run.elements.empty()) run_start = s;
      take(i, &run);
    }
  }
  hold();
  if (!late.elements.empty()) out->push_back(std::move(late));
  Release(out);
  return dropped;
}

void TaskOrder::Release(std::vector<Piece>* out) {
  while (!held_.empty()) {
    auto first = held_.begin();
    if (first->first != next_seq_) {
      if (recovering_) return;  // the resends fill the gap
      if (!outstanding_.empty() && *outstanding_.begin() < first->second.horizon) {
        return;  // an earlier reply may still come
      }
      given_up_.emplace(next_seq_, first->first);
      while (given_up_.size() > kGivenUpKept) given_up_.erase(given_up_.begin());
    }
    next_seq_ = first->second.end(first->first);
    out->push_back(std::move(first->second.piece));
    held_.erase(first);
  }
}

// ---- SplitDedup --------------------------------------------------------------------

bool SplitDedup::FirstDelivery(int64_t split_id, int64_t index) {
  if (split_id <= 0 || index < 0) return true;  // untracked
  // A late reply for a split forgotten as completed: prefer delivering it
  // (at least once) to dropping an element that may be new.
  if (split_id < watermark_ && !seen_.count(split_id)) return true;
  return seen_[split_id].Insert(index);
}

IndexSet SplitDedup::Seen(int64_t split_id) const {
  auto s = seen_.find(split_id);
  return s == seen_.end() ? IndexSet() : s->second;
}

void SplitDedup::SetWatermark(int64_t watermark, bool hold) {
  watermark_ = std::max(watermark_, watermark);
  if (!hold) seen_.erase(seen_.begin(), seen_.lower_bound(watermark_));
}

// ---- Reader ------------------------------------------------------------------------

Element Reader::TakeElement() {
  Piece& batch = results_.front();
  last_key_ = batch.positions[next_in_batch_].key;
  OnTaken(batch.positions[next_in_batch_]);
  Element e = std::move(batch.elements[next_in_batch_++]);
  if (next_in_batch_ == batch.elements.size()) {
    results_.pop_front();
    next_in_batch_ = 0;
  }
  return e;
}

std::optional<std::vector<proto::SplitProgress>> Reader::SplitReports(
    const std::map<int64_t, ClientTask>& tasks, const std::vector<int64_t>& ids) const {
  std::vector<proto::SplitProgress> none;
  for (int64_t id : ids) none.emplace_back().set_split_id(id);
  return none;
}

absl::Time Reader::NextWakeup(const std::map<int64_t, ClientTask>& tasks) const {
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, t] : tasks) {
    if (!t.lost && !t.end_of_sequence && t.retry_after > now) next = std::min(next, t.retry_after);
  }
  return next;
}

bool Reader::RetryOrFail(ClientTask& t, const absl::Status& s, absl::Time now,
                         const std::string& what) {
  if (stopping_) return false;
  if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s) && !absl::IsCancelled(s)) {
    if (error_.ok()) error_ = s;  // the worker's own error, e.g. the dataset failed
    return false;
  }
  // The worker may be restarting or gone; the dispatcher decides (it marks
  // the task lost after worker_timeout_ms).
  counters_.worker_errors++;
  if (t.failures++ == 0) {
    spdlog::warn("sluice client: {} from task {} on worker {}: {}; retrying", what, t.id, t.worker,
                 std::string(s.message()));
  }
  t.retry_after =
      now + std::min(absl::Milliseconds(20) * (1 << std::min(t.failures, 6)), absl::Seconds(1));
  return true;
}

// ---- FcfsReader --------------------------------------------------------------------

// Among the tasks that may be asked, the one with the fewest requests in
// flight, the first after rr_ among equals: preferring the least loaded
// keeps requests from piling up on a task with nothing ready (each such
// request waits up to element_wait) while another has elements buffered.
//
// The last free slot (`free` counts max_outstanding minus replies
// requested, held or buffered) is never parked (a request that may wait
// element_wait for an element) when that could hold up elements: it gets a
// probe (wait 0; the worker answers at once) instead
//  - while another task than the one asked is busy (its last reply had
//    elements). With one slot every other request used to wait
//    element_wait on a task with nothing to give -- in distributed_epoch
//    the task of a worker that read its last split and waits for the
//    epoch's end, which needs the acknowledgements of the other task's
//    elements;
//  - in distributed_epoch while other requests are in flight: with every
//    slot parked, the acknowledgements of the last elements received could
//    not be sent, and the epoch's end waited for a parked request to time
//    out.
// A task whose last reply was not_ready (idle) gets at most one request at
// a time while another task is busy, and a probe of an idle task needs a
// reply with elements since the last one (probe_allowed_), so probes never
// spin. With nothing in flight a request may always wait.
ClientTask* FcfsReader::Pick(std::map<int64_t, ClientTask>& tasks, int64_t free, absl::Time now,
                             absl::Duration* wait) {
  // A recovering task is asked by Plan alone; one that answered
  // end_of_sequence waits for its requests in flight.
  auto readable = [now](const ClientTask& t) {
    return !t.end_of_sequence && !t.lost && t.retry_after <= now && !t.eos_pending &&
           !t.order.recovering();
  };
  int64_t busy = 0;
  for (const auto& [id, t] : tasks) busy += readable(t) && !t.idle;
  auto others_busy = [busy](const ClientTask& t) { return busy > (t.idle ? 0 : 1); };
  auto probe = [&](const ClientTask& t) {
    return free < 2 && (others_busy(t) || (options_.distributed && in_flight_ > 0));
  };
  auto start = tasks.upper_bound(rr_);
  ClientTask* best = nullptr;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto it = pass == 0 ? start : tasks.begin(); it != tasks.end(); ++it) {
      if (pass == 1 && it == start) break;
      ClientTask& t = it->second;
      if (!readable(t)) continue;
      if (t.idle && ((others_busy(t) && t.in_flight > 0) || (probe(t) && !probe_allowed_))) {
        continue;
      }
      if (best == nullptr || t.in_flight < best->in_flight) best = &t;
    }
  }
  if (best == nullptr) return nullptr;
  rr_ = best->id;
  *wait = options_.element_wait;
  if (probe(*best)) {
    *wait = absl::ZeroDuration();
    if (best->idle) probe_allowed_ = false;
  }
  return best;
}

PlannedRequest FcfsReader::Request(ClientTask& t, absl::Duration wait, bool leaving) {
  PlannedRequest p;
  p.task_id = t.id;
  p.transport = t.transport;
  p.number = t.order.Sent();
  ElementRequest& req = p.request;
  req.compression = options_.compression;
  req.task_id = t.id;
  req.consumer_index = options_.consumer_index;
  req.client_id = options_.client_id;
  req.max_outstanding = std::min(options_.max_outstanding, kMaxRequestsInFlight);
  req.shared_job = options_.shared_job;
  req.max_elements = options_.max_elements_per_reply;
  req.max_bytes = kMaxBytesPerReply;
  req.wait = wait;
  if (options_.client_id != 0) {  // the worker keeps replies for named consumers only
    req.delivered_seq = t.order.delivered();
    req.resend = t.order.recovering() && !leaving;
    req.leaving = leaving;
  }
  // Acknowledged once sent: a lost request's acks are not resent (an ack
  // counted twice could complete a split too early); the worker's ack
  // timeout covers them.
  while (!t.unacked.empty() && req.acks.size() < kMaxAcksPerRequest) {
    req.acks.push_back({t.unacked.begin()->first, t.unacked.begin()->second});
    t.unacked.erase(t.unacked.begin());
  }
  if (leaving) return p;
  ++t.in_flight;
  ++in_flight_;
  return p;
}

std::vector<PlannedRequest> FcfsReader::Leave(std::map<int64_t, ClientTask>& tasks) {
  std::vector<PlannedRequest> out;
  if (options_.client_id == 0) return out;  // the worker keeps no anonymous consumers
  for (auto& [id, t] : tasks) {
    if (t.lost || t.end_of_sequence || t.transport == nullptr) continue;
    out.push_back(Request(t, absl::ZeroDuration(), /*leaving=*/true));
    out.back().request.transfer_allowance = kLeaveAllowance;
  }
  return out;
}

std::vector<PlannedRequest> FcfsReader::Plan(std::map<int64_t, ClientTask>& tasks,
                                             absl::Time now) {
  std::vector<PlannedRequest> out;
  if (!error_.ok()) return out;
  // A recovering task asks for its resends one request at a time, whatever
  // the free slots: its held replies may be what fills them.
  for (auto& [id, t] : tasks) {
    if (t.order.recovering() && t.in_flight == 0 && !t.lost && !t.end_of_sequence &&
        t.retry_after <= now && in_flight_ < kMaxRequestsInFlight) {
      out.push_back(Request(t, options_.element_wait));
    }
  }
  while (true) {
    const int64_t free = options_.max_outstanding - static_cast<int64_t>(results_.size()) -
                         held_ - in_flight_;
    if (free <= 0 || in_flight_ >= kMaxRequestsInFlight) break;
    absl::Duration wait;
    ClientTask* t = Pick(tasks, free, now, &wait);
    if (t == nullptr) break;
    out.push_back(Request(*t, wait));
  }
  return out;
}

void FcfsReader::Deliver(ClientTask& t, std::vector<Piece> pieces) {
  for (Piece& piece : pieces) {
    Piece fresh;
    fresh.elements.reserve(piece.elements.size());
    for (size_t i = 0; i < piece.elements.size(); ++i) {
      const SplitPosition pos = i < piece.positions.size() ? piece.positions[i] : SplitPosition{};
      if (pos.split_id > 0) ++t.unacked[pos.split_id];
      if (dedup_.FirstDelivery(pos.split_id, pos.index)) {
        fresh.elements.push_back(std::move(piece.elements[i]));
        fresh.positions.push_back(pos);
      } else {
        counters_.duplicates++;  // a reassigned split's element we already have
      }
    }
    if (!fresh.elements.empty()) results_.push_back(std::move(fresh));
  }
}

void FcfsReader::FinishEndOfSequence(ClientTask& t) {
  t.eos_pending = false;
  if (t.eos_total < 0 || options_.client_id == 0 || t.order.Complete(t.eos_total)) {
    t.end_of_sequence = true;
    return;
  }
  if (!t.eos_after_resend) {
    // Handed out, never arrived, and no failure seen: ask for them.
    t.order.StartRecovery();
    return;
  }
  // The worker had nothing to resend, yet the elements never arrived.
  t.end_of_sequence = true;
  if (error_.ok()) {
    error_ = absl::DataLossError(absl::StrCat(
        "task ", t.id, " on worker ", t.worker, " handed this consumer ", t.eos_total,
        " elements, but only the first ", t.order.delivered(), " arrived"));
  }
}

void FcfsReader::OnReply(std::map<int64_t, ClientTask>& tasks, const PlannedRequest& sent,
                         absl::StatusOr<ElementResult> r, absl::Time now) {
  --in_flight_;
  auto it = tasks.find(sent.task_id);
  if (it == tasks.end()) return;
  ClientTask& t = it->second;
  --t.in_flight;
  const int64_t held_before = t.order.held();
  std::vector<Piece> ready;
  if (r.ok()) {
    t.order.Done(sent.number);
    t.failures = 0;
    // A resend the worker had nothing for: it handed out nothing more than
    // what arrived.
    if (sent.request.resend && !r->resent) t.order.EndRecovery();
    if (r->end_of_sequence) {
      t.eos_pending = true;
      t.eos_total = r->seq;
      t.eos_after_resend = sent.request.resend;
    } else if (r->not_ready || r->elements.empty()) {
      t.idle = true;
    } else {
      t.idle = false;
      probe_allowed_ = true;
      const int64_t n = static_cast<int64_t>(r->elements.size());
      t.received += n;
      counters_.elements += n;
      counters_.bytes += static_cast<int64_t>(r->bytes);
      Piece piece{std::move(r->elements), std::move(r->positions)};
      if (options_.distributed) {
        for (const SplitPosition& pos : piece.positions) progress_.Arrived(pos);
      }
      counters_.duplicates += t.order.Arrived(r->seq, std::move(piece), &ready);
    }
  } else if (!t.lost && RetryOrFail(t, r.status(), now, "a request") &&
             options_.client_id != 0) {
    t.order.Failed(sent.number);  // its reply may be lost: ask the worker to resend
  } else {
    t.order.Done(sent.number);
  }
  if (t.lost) t.order.EndRecovery();
  t.order.Release(&ready);
  if (t.eos_pending && t.in_flight == 0) FinishEndOfSequence(t);
  Deliver(t, std::move(ready));
  held_ += t.order.held() - held_before;
  if (t.lost && t.in_flight == 0) dedup_.SetWatermark(watermark_, LostTaskInFlight(tasks));
}

void FcfsReader::OnTaskLost(std::map<int64_t, ClientTask>& tasks, ClientTask& t) {
  // Nothing will fill its gaps now: deliver what it holds.
  const int64_t held_before = t.order.held();
  std::vector<Piece> ready;
  t.order.EndRecovery();
  t.order.Release(&ready);
  Deliver(t, std::move(ready));
  held_ += t.order.held() - held_before;
  dedup_.SetWatermark(watermark_, LostTaskInFlight(tasks));
}

bool FcfsReader::LostTaskInFlight(const std::map<int64_t, ClientTask>& tasks) const {
  for (const auto& [id, t] : tasks) {
    if (t.lost && t.in_flight > 0) return true;
  }
  return false;
}

std::optional<std::vector<proto::SplitProgress>> FcfsReader::SplitReports(
    const std::map<int64_t, ClientTask>& tasks, const std::vector<int64_t>& ids) const {
  if (LostTaskInFlight(tasks)) return std::nullopt;
  std::vector<proto::SplitProgress> reports;
  for (int64_t id : ids) {
    const IndexSet seen = dedup_.Seen(id);
    proto::SplitProgress& p = reports.emplace_back();
    p.set_split_id(id);
    p.set_delivered_prefix(seen.prefix());
    p.set_delivered_beyond(seen.beyond());
  }
  return reports;
}

void FcfsReader::SetSplitWatermark(std::map<int64_t, ClientTask>& tasks, int64_t watermark) {
  watermark_ = std::max(watermark_, watermark);
  progress_.SetWatermark(watermark_);
  dedup_.SetWatermark(watermark_, LostTaskInFlight(tasks));
}

// ---- SplitProgressTracker ---------------------------------------------------------

bool SplitProgressTracker::Tracked(const SplitPosition& pos) {
  return pos.split_id > 0 && pos.index >= 0 && pos.index <= IndexSet::kMaxIndex &&
         pos.epoch >= 0 && pos.begin >= 0 && pos.end > pos.begin;
}

void SplitProgressTracker::Seed(const proto::ServiceCheckpoint& from) {
  for (const proto::SplitProgress& sp : from.splits()) {
    Carried& c = carried_[{sp.epoch(), sp.begin()}];
    c.end = sp.end();
    c.done = sp.done();
    if (!c.done) c.delivered = IndexSet(sp.delivered_prefix(), sp.delivered_beyond());
  }
}

void SplitProgressTracker::Arrived(const SplitPosition& pos) {
  if (!Tracked(pos)) return;
  Progress& p = splits_[pos.split_id];
  p.epoch = pos.epoch;
  p.begin = pos.begin;
  p.end = pos.end;
  ++p.arrived;
}

void SplitProgressTracker::Returned(const SplitPosition& pos) {
  if (!Tracked(pos)) {
    untracked_ = true;
    return;
  }
  Progress& p = splits_[pos.split_id];
  p.delivered.Insert(pos.index);
}

proto::ServiceCheckpoint SplitProgressTracker::Save(int64_t positions) const {
  proto::ServiceCheckpoint c;
  c.set_version(1);
  c.set_positions(positions);
  c.set_split_watermark(watermark_);
  c.set_consumers(1);
  // By (epoch, begin), as the dispatcher's provider reads them: this
  // iteration's splits, with what the checkpoint it resumed from carried
  // of the same ranges, and the carried ranges it has not read from.
  std::map<std::pair<int64_t, int64_t>, proto::SplitProgress> out;
  for (const auto& [id, p] : splits_) {
    proto::SplitProgress& sp = out[{p.epoch, p.begin}];
    sp.set_split_id(id);
    sp.set_epoch(p.epoch);
    sp.set_begin(p.begin);
    sp.set_end(p.end);
    const bool held_back = p.arrived > p.delivered.size();
    sp.set_undelivered(held_back);
    sp.set_done(id < watermark_ && !held_back);
    IndexSet delivered = p.delivered;
    auto carried = carried_.find({p.epoch, p.begin});
    if (carried != carried_.end() && carried->second.end == p.end) {
      delivered.Merge(carried->second.delivered);
    }
    // Kept when done too: merged with other consumers' saves, the split
    // may not be (MergeServiceCheckpoints).
    sp.set_delivered_prefix(delivered.prefix());
    sp.set_delivered_beyond(delivered.beyond());
  }
  for (const auto& [at, carried] : carried_) {
    if (out.count(at)) continue;
    proto::SplitProgress& sp = out[at];
    sp.set_epoch(at.first);
    sp.set_begin(at.second);
    sp.set_end(carried.end);
    sp.set_done(carried.done);  // split_id 0: carried, done whatever the watermark
    sp.set_delivered_prefix(carried.delivered.prefix());
    sp.set_delivered_beyond(carried.delivered.beyond());
  }
  for (auto& [at, sp] : out) *c.add_splits() = std::move(sp);
  return c;
}

absl::StatusOr<proto::ServiceCheckpoint> MergeServiceCheckpoints(
    const std::vector<proto::ServiceCheckpoint>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no service checkpoints to merge");
  if (parts[0].num_consumers() > 0) {
    // Coordinated reads: the consumers' round, which agrees when they saved
    // at the same training step (each step takes one round of each).
    proto::ServiceCheckpoint out = parts[0];
    out.set_consumers(0);
    for (const proto::ServiceCheckpoint& c : parts) {
      if (c.version() != 1 || c.num_consumers() != parts[0].num_consumers() ||
          c.splits_size() > 0) {
        return absl::InvalidArgumentError(
            "the service checkpoints to merge are of different versions or jobs");
      }
      if (c.round() != parts[0].round()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the coordinated consumers' checkpoints to merge are at rounds ", parts[0].round(),
            " and ", c.round(), ": save every consumer at the same training step"));
      }
      out.set_consumers(out.consumers() + std::max(1, c.consumers()));
    }
    if (out.consumers() > out.num_consumers()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merging ", out.consumers(), " checkpoints of a job of ", out.num_consumers(),
          " coordinated consumers: a consumer's checkpoint is there twice, or the jobs differ"));
    }
    return out;
  }
  struct Merged {
    int64_t end = 0, split_id = 0;
    bool undelivered = false, carried_done = false;
    IndexSet delivered;
  };
  std::map<std::pair<int64_t, int64_t>, Merged> splits;  // by (epoch, begin)
  int64_t watermark = parts[0].split_watermark();
  int32_t consumers = 0;
  for (const proto::ServiceCheckpoint& c : parts) {
    if (c.version() != 1 || c.positions() != parts[0].positions() || c.num_consumers() > 0) {
      return absl::InvalidArgumentError(
          "the service checkpoints to merge are of different versions or sources");
    }
    watermark = std::min(watermark, c.split_watermark());
    consumers += std::max(1, c.consumers());
    for (const proto::SplitProgress& sp : c.splits()) {
      if (!IndexSet::Valid(sp.delivered_prefix(), sp.delivered_beyond())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a service checkpoint to merge holds a bad delivered set at epoch ", sp.epoch(),
            ", position ", sp.begin()));
      }
      auto [m, fresh] = splits.try_emplace({sp.epoch(), sp.begin()});
      Merged& into = m->second;
      if (!fresh && (into.end != sp.end() ||
                     (into.split_id > 0 && sp.split_id() > 0 && into.split_id != sp.split_id()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the service checkpoints to merge cut epoch ", sp.epoch(), " differently at position ",
            sp.begin(), ": they are of different iterations"));
      }
      into.end = sp.end();
      into.split_id = std::max(into.split_id, sp.split_id());
      into.undelivered = into.undelivered || sp.undelivered();
      // A range carried done from the checkpoint the job resumed from
      // (no id in this iteration) is done for every consumer.
      into.carried_done = into.carried_done || (sp.split_id() <= 0 && sp.done());
      into.delivered.Merge(IndexSet(sp.delivered_prefix(), sp.delivered_beyond()));
    }
  }
  proto::ServiceCheckpoint out;
  out.set_version(1);
  out.set_positions(parts[0].positions());
  out.set_split_watermark(watermark);
  out.set_consumers(consumers);
  for (const auto& [at, m] : splits) {
    proto::SplitProgress* sp = out.add_splits();
    sp->set_epoch(at.first);
    sp->set_begin(at.second);
    sp->set_end(m.end);
    sp->set_split_id(m.split_id);
    sp->set_undelivered(m.undelivered);
    // Complete before the earliest save, and nothing of it held back.
    sp->set_done(m.carried_done ||
                 (m.split_id > 0 && m.split_id < watermark && !m.undelivered));
    if (!sp->done()) {
      sp->set_delivered_prefix(m.delivered.prefix());
      sp->set_delivered_beyond(m.delivered.beyond());
    }
  }
  return out;
}

// ---- RoundReader -------------------------------------------------------------------

ClientTask* RoundReader::TaskForRound(std::map<int64_t, ClientTask>& tasks, int64_t round) {
  std::vector<ClientTask*> active;
  bool any_live = false;
  for (auto& [id, t] : tasks) {
    if (t.starting_round > round) continue;
    active.push_back(&t);
    any_live = any_live || (!t.lost && !t.end_of_sequence);
  }
  if (!any_live) return nullptr;
  return active[round % static_cast<int64_t>(active.size())];
}

void RoundReader::Resolve(int64_t round, std::optional<Element> e, SplitPosition pos) {
  Piece p;
  if (e) {
    p.elements.push_back(*std::move(e));
    p.positions.push_back(pos);
  } else {
    counters_.rounds_skipped++;
  }
  rounds_.emplace(round, std::move(p));
  for (auto it = rounds_.begin(); it != rounds_.end() && it->first == deliver_round_;
       it = rounds_.erase(it)) {
    if (!it->second.elements.empty()) {
      results_.push_back(std::move(it->second));
      result_rounds_.push_back(it->first);
    }
    ++deliver_round_;
  }
}

PlannedRequest RoundReader::Request(ClientTask& t, int64_t round) {
  PlannedRequest p;
  p.task_id = t.id;
  p.transport = t.transport;
  p.round = round;
  p.request.task_id = t.id;
  p.request.consumer_index = options_.consumer_index;
  p.request.round = round;
  // Redelivery: every round below deliver_round_ is held here, so the
  // worker may forget it; a round asked again (its reply was lost) comes
  // back as it was.
  p.request.delivered_seq = deliver_round_;
  p.request.compression = options_.compression;
  p.request.wait = options_.element_wait;
  p.request.max_bytes = kMaxBytesPerReply;
  ++t.in_flight;
  ++in_flight_;
  return p;
}

std::vector<PlannedRequest> RoundReader::Plan(std::map<int64_t, ClientTask>& tasks,
                                              absl::Time now) {
  std::vector<PlannedRequest> out;
  if (!error_.ok()) return out;
  // Rounds to ask again whose time came.
  for (auto it = retries_.begin(); it != retries_.end();) {
    if (it->at > now) {
      ++it;
      continue;
    }
    auto t = tasks.find(it->task_id);
    if (t == tasks.end() || t->second.lost || t->second.end_of_sequence) {
      Resolve(it->round, std::nullopt);
    } else {
      out.push_back(Request(t->second, it->round));
    }
    it = retries_.erase(it);
  }
  while (next_round_ - deliver_round_ + static_cast<int64_t>(results_.size()) <
             options_.max_outstanding &&
         in_flight_ + static_cast<int64_t>(retries_.size()) < kMaxRequestsInFlight &&
         (honoured_block_ < 0 || next_round_ < honoured_block_)) {
    ClientTask* t = TaskForRound(tasks, next_round_);
    if (t == nullptr) break;
    const int64_t round = next_round_++;
    if (t->lost || t->end_of_sequence) {
      Resolve(round, std::nullopt);
      continue;
    }
    out.push_back(Request(*t, round));
  }
  return out;
}

void RoundReader::OnReply(std::map<int64_t, ClientTask>& tasks, const PlannedRequest& sent,
                          absl::StatusOr<ElementResult> r, absl::Time now) {
  --in_flight_;
  auto it = tasks.find(sent.task_id);
  if (it == tasks.end()) return Resolve(sent.round, std::nullopt);
  ClientTask& t = it->second;
  --t.in_flight;
  if (r.ok() && !r->end_of_sequence && !r->not_ready && !r->elements.empty()) {
    t.failures = 0;
    t.received++;
    counters_.elements++;
    counters_.bytes += static_cast<int64_t>(r->bytes);
    return Resolve(sent.round, std::move(r->elements[0]),
                   r->positions.empty() ? SplitPosition{} : r->positions[0]);
  }
  if (r.ok() && r->end_of_sequence) t.end_of_sequence = true;
  if (t.lost || t.end_of_sequence) return Resolve(sent.round, std::nullopt);
  if (r.ok()) {  // not ready yet: ask again at once (the worker held it)
    retries_.push_back({sent.round, t.id, now});
    return;
  }
  if (!RetryOrFail(t, r.status(), now, absl::StrCat("round ", sent.round))) {
    return Resolve(sent.round, std::nullopt);
  }
  retries_.push_back({sent.round, t.id, t.retry_after});
}

absl::Time RoundReader::NextWakeup(const std::map<int64_t, ClientTask>&) const {
  absl::Time next = absl::InfiniteFuture();
  for (const Retry& r : retries_) next = std::min(next, r.at);
  return next;
}

}  // namespace sluice::internal
