// The dispatcher's long polls (WorkerHeartbeat, ClientHeartbeat, GetSplit),
// by what they wait for: a worker's news, an iteration's version, an
// iteration's splits. Two kinds of waiter:
//  - a thread (the synchronous methods, tests) waits on a condition
//    variable of its key (Await), woken only by a change to that key:
//    absl::Mutex::Await would re-evaluate every waiter's condition at every
//    unlock, and a fleet holds thousands of polls;
//  - a parked poll (the gRPC callback methods) holds no thread: it is a
//    step function kept here with its deadline, made due by Wake or by the
//    deadline, and run by the dispatcher's poll thread (Due).
// Not thread-safe: the dispatcher calls every method holding its mutex,
// which Await releases while it waits.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice::internal {

class LongPolls {
 public:
  struct Key {
    enum Kind : uint8_t { kWorker, kVersion, kSplits } kind = kWorker;
    int64_t iteration = 0;
    std::string worker;
    auto operator<=>(const Key&) const = default;
  };
  static Key Worker(const std::string& address) { return {Key::kWorker, 0, address}; }
  static Key Version(int64_t iteration) { return {Key::kVersion, iteration, ""}; }
  static Key Splits(int64_t iteration) { return {Key::kSplits, iteration, ""}; }

  // A long poll as steps, each run under the dispatcher's mutex: the first
  // does the request's work and either answers (fills the reply) or asks
  // to wait (sets `wait`, with the key a change to which may end the wait,
  // the condition and the deadline); each later step runs when the wait
  // ends (`timed_out`: the condition never held) and answers or waits again.
  struct Step {
    bool wait = false;
    Key key;
    std::function<bool()> ready;
    absl::Time deadline;
    bool timed_out = false;  // in: the previous wait ran out
  };
  using Fn = std::function<absl::Status(Step*)>;
  using Done = std::function<void(absl::Status)>;
  using IsCancelled = std::function<bool()>;
  struct Parked {
    Fn poll;
    Step step;
    Done done;
  };

  // A thread's wait: until `ready` (evaluated by this thread after each
  // wake-up), `timeout`, or the caller going away (checked every
  // `cancel_check`); false only in the last case.
  bool Await(absl::Mutex& mu, const Key& key, const std::function<bool()>& ready,
             absl::Duration timeout, const IsCancelled& cancelled, absl::Duration cancel_check);
  // Wakes the threads waiting on `key` and makes its parked polls due;
  // true when there were parked polls (the poll thread has work).
  bool Wake(const Key& key);
  void WakeAllThreads();

  int64_t NewId() { return next_id_++; }
  void Park(int64_t id, Parked parked);
  std::optional<Parked> Unpark(int64_t id);
  const Parked* Find(int64_t id) const;
  // The parked polls due now: woken ones, and those whose deadline passed
  // by `now` (every one when `all`), as (id, timed out). An id may appear
  // twice, and a woken poll may not be ready: check Find and `ready`.
  std::vector<std::pair<int64_t, bool>> Due(absl::Time now, bool all);
  bool empty() const { return parked_.empty(); }
  absl::Time NextDeadline() const {
    return deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
  }

 private:
  std::map<Key, std::shared_ptr<absl::CondVar>> waiting_;  // a key's entry lives while a thread waits
  std::map<int64_t, Parked> parked_;
  std::map<Key, std::set<int64_t>> parked_by_key_;
  std::set<std::pair<absl::Time, int64_t>> deadlines_;
  std::vector<int64_t> woken_;
  int64_t next_id_ = 1;
};

}  // namespace sluice::internal
