#include "sluice/control/liveness.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

namespace {

template <typename Map, typename Key>
absl::Duration Since(const Map& m, const Key& key, absl::Time now) {
  auto found = m.find(key);
  return now - (found == m.end() ? absl::Time() : found->second);
}

template <typename Map>
absl::Duration Longest(const Map& m, absl::Time now) {
  absl::Duration longest = absl::ZeroDuration();
  for (const auto& [key, t] : m) longest = std::max(longest, now - t);
  return longest;
}

}  // namespace

void Liveness::Follow(const proto::JournalUpdate& u, const DispatcherState::Changes& c,
                      absl::Time now) {
  switch (u.kind_case()) {
    case proto::JournalUpdate::kRegisterWorker:
      workers_.try_emplace(u.register_worker().address(), now);  // a restart keeps its time
      break;
    case proto::JournalUpdate::kRemoveWorker:
      workers_.erase(u.remove_worker().address());
      break;
    case proto::JournalUpdate::kCreateClient:
      clients_[u.create_client().client_id()] = now;
      break;
    case proto::JournalUpdate::kRemoveClient:
      clients_.erase(u.remove_client().client_id());
      break;
    default:
      break;
  }
  for (int64_t id : c.idle) idle_since_[id] = now;
  for (int64_t id : c.dropped) idle_since_.erase(id);
}

void Liveness::Restart(const DispatcherState& state, absl::Time now) {
  for (const auto& [id, it] : state.iterations()) {
    if (it.clients.empty()) idle_since_[id] = now;
  }
  for (const auto& [addr, w] : state.workers()) workers_[addr] = now;
  for (const auto& [id, c] : state.clients()) clients_[id] = now;
}

void Liveness::Expire(const DispatcherState& state, absl::Time now, int64_t worker_timeout_ms,
                      int64_t client_timeout_ms, proto::JournalRecord* rec,
                      std::vector<std::string>* lost) const {
  for (const auto& [addr, w] : state.workers()) {
    const absl::Duration silent = WorkerSilence(addr, now);
    if (silent <= absl::Milliseconds(worker_timeout_ms)) continue;
    rec->add_updates()->mutable_remove_worker()->set_address(addr);
    int64_t unfinished = 0;
    for (int64_t id : w.tasks) {
      auto t = state.tasks().find(id);
      unfinished += t != state.tasks().end() && !t->second.completed && !t->second.lost;
    }
    lost->push_back(absl::StrCat("dispatcher: worker ", addr, " lost: no heartbeat for ",
                                 absl::ToInt64Milliseconds(silent), " ms (worker_timeout_ms=",
                                 worker_timeout_ms, "); ", unfinished,
                                 " unfinished task(s) lost"));
  }
  for (const auto& [id, c] : state.clients()) {
    if (ClientSilence(id, now) > absl::Milliseconds(client_timeout_ms)) {
      spdlog::warn("dispatcher: iteration client {} timed out after {} ms; releasing it", id,
                   client_timeout_ms);
      rec->add_updates()->mutable_remove_client()->set_client_id(id);
    }
  }
}

void Liveness::Collect(const DispatcherState& state, absl::Time now, int64_t job_gc_timeout_ms,
                       proto::JournalRecord* rec) const {
  for (const auto& [id, it] : state.iterations()) {
    if (it.collected || !it.clients.empty()) continue;
    const bool anonymous = state.jobs().at(it.job_id).name.empty();
    if (it.finished || anonymous || Idle(id, now) > absl::Milliseconds(job_gc_timeout_ms)) {
      rec->add_updates()->mutable_collect_iteration()->set_iteration_id(id);
    }
  }
}

absl::Duration Liveness::WorkerSilence(const std::string& address, absl::Time now) const {
  return Since(workers_, address, now);
}
absl::Duration Liveness::ClientSilence(int64_t id, absl::Time now) const {
  return Since(clients_, id, now);
}
absl::Duration Liveness::Idle(int64_t iteration, absl::Time now) const {
  return Since(idle_since_, iteration, now);
}
absl::Duration Liveness::MaxWorkerSilence(absl::Time now) const { return Longest(workers_, now); }
absl::Duration Liveness::MaxClientSilence(absl::Time now) const { return Longest(clients_, now); }

}  // namespace sluice::internal
