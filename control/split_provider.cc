#include "sluice/control/split_provider.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "sluice/core/compress.h"
#include "sluice/dataset/dataset_internal.h"

namespace sluice::internal {

absl::Status SplitProvider::Describe(const proto::DatasetNode& source,
                                     int64_t range_split_elements, int64_t file_split_files,
                                     proto::CreateIterationUpdate* u) {
  auto plan = SplitSourcePositions(source);
  // NotFound / Unavailable: a ListFiles pattern, globbed here.
  if (absl::IsNotFound(plan.status()) || absl::IsUnavailable(plan.status())) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("distributed_epoch: ", plan.status().message(),
                                     " on the dispatcher (it lists the files to split them; "
                                     "workers and the dispatcher must see the same file system)"));
  }
  if (!plan.ok()) return plan.status();
  u->set_has_splits(true);
  u->set_positions(plan->positions);
  if (!plan->files.empty()) {
    u->set_split_elements(file_split_files > 0 ? file_split_files
                                               : AutoFileRun(plan->positions));
  } else {
    u->set_split_elements(
        plan->multi_position_splits ? std::max<int64_t>(1, range_split_elements) : 1);
  }
  if (!plan->files.empty()) {
    std::string joined;
    for (const std::string& f : plan->files) {
      joined += f;
      joined += '\0';
    }
    u->set_packed_files(ZstdCompress(joined));
  }
  return absl::OkStatus();
}

namespace {

// A listing unpacks to at most this (a listing of 100 M long paths).
constexpr uint64_t kMaxListingBytes = uint64_t{16} << 30;

}  // namespace

absl::StatusOr<std::unique_ptr<SplitProvider>> SplitProvider::Create(
    const proto::CreateIterationUpdate& u) {
  if (u.packed_files().empty()) {
    if (u.files_size() > 0 && u.files_size() != u.positions()) {
      return absl::DataLossError(absl::StrCat("iteration ", u.iteration_id(), " lists ",
                                              u.files_size(), " files for ", u.positions(),
                                              " positions"));
    }
    return std::make_unique<SplitProvider>(u);
  }
  absl::StatusOr<std::string> joined = ZstdDecompress(u.packed_files(), kMaxListingBytes);
  if (!joined.ok()) {
    return absl::DataLossError(absl::StrCat("iteration ", u.iteration_id(),
                                            ": its packed file listing: ",
                                            joined.status().message()));
  }
  std::vector<std::string> files;
  files.reserve(static_cast<size_t>(std::max<int64_t>(0, u.positions())));
  size_t start = 0;
  while (start < joined->size()) {
    const size_t end = joined->find('\0', start);
    if (end == std::string::npos) {
      return absl::DataLossError(absl::StrCat(
          "iteration ", u.iteration_id(), ": its packed file listing ends inside a name"));
    }
    files.emplace_back(*joined, start, end - start);
    start = end + 1;
  }
  if (static_cast<int64_t>(files.size()) != u.positions()) {
    return absl::DataLossError(absl::StrCat("iteration ", u.iteration_id(), " packs ",
                                            files.size(), " files for ", u.positions(),
                                            " positions"));
  }
  auto p = std::make_unique<SplitProvider>(u);
  p->files_ = std::move(files);
  p->packed_files_ = u.packed_files();
  return p;
}

SplitProvider::SplitProvider(const proto::CreateIterationUpdate& u)
    : positions_(u.positions()),
      split_elements_(std::max<int64_t>(1, u.split_elements())),
      files_(u.files().begin(), u.files().end()) {
  if (!u.has_resume()) return;
  resume_def_ = u.resume();
  for (const proto::SplitProgress& sp : u.resume().splits()) {
    ResumeRange r;
    r.end = sp.end();
    r.done = sp.done();
    r.delivered = IndexSet(sp.delivered_prefix(), sp.delivered_beyond());
    resume_[sp.epoch()][sp.begin()] = std::move(r);
  }
}

absl::Status SplitProvider::CheckResume(const proto::ServiceCheckpoint& resume,
                                        int64_t positions) {
  if (resume.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the service checkpoint has version ", resume.version(), "; this dispatcher reads 1"));
  }
  if (resume.positions() != positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the service checkpoint was saved over ", resume.positions(),
        " source positions per epoch; the source has ", positions,
        " now (its files changed?): it cannot resume there"));
  }
  std::map<int64_t, std::map<int64_t, int64_t>> ranges;  // epoch -> begin -> end
  for (const proto::SplitProgress& sp : resume.splits()) {
    if (sp.epoch() < 0 || sp.begin() < 0 || sp.end() <= sp.begin() || sp.end() > positions ||
        !IndexSet::Valid(sp.delivered_prefix(), sp.delivered_beyond())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the service checkpoint holds a bad split: epoch ", sp.epoch(), ", positions [",
          sp.begin(), ", ", sp.end(), ") of ", positions));
    }
    auto& epoch = ranges[sp.epoch()];
    auto next = epoch.lower_bound(sp.begin());
    const bool overlaps_next = next != epoch.end() && next->first < sp.end();
    const bool overlaps_prev = next != epoch.begin() && std::prev(next)->second > sp.begin();
    if (overlaps_next || overlaps_prev) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the service checkpoint's splits overlap in epoch ", sp.epoch(), " at positions [",
          sp.begin(), ", ", sp.end(), ")"));
    }
    epoch.emplace(sp.begin(), sp.end());
  }
  return absl::OkStatus();
}

int64_t SplitProvider::SkipDone(int64_t epoch, int64_t p) const {
  auto e = resume_.find(epoch);
  if (e == resume_.end()) return p;
  while (true) {
    auto r = e->second.find(p);
    if (r == e->second.end() || !r->second.done) return p;
    p = r->second.end;
  }
}

void SplitProvider::DescribeTo(proto::CreateIterationUpdate* u) const {
  if (resume_def_) {
    *u->mutable_resume() = *resume_def_;
  }
  u->set_has_splits(true);
  u->set_positions(positions_);
  u->set_split_elements(split_elements_);
  if (!packed_files_.empty()) {
    u->set_packed_files(packed_files_);
  } else {
    for (const std::string& f : files_) u->add_files(f);
  }
}

bool SplitProvider::Next(int64_t task, int64_t epoch, proto::GetSplitResponse* resp,
                         proto::AssignSplitUpdate* assign) const {
  resp->set_epoch_had_splits(positions_ > 0);
  if (epoch < done_below_) {
    resp->set_end_of_splits(true);
    return false;
  }
  static const Epoch kFresh;
  auto found = epochs_.find(epoch);
  const Epoch& e = found == epochs_.end() ? kFresh : found->second;
  assign->set_task_id(task);
  bool waiting = false;  // queued splits wait for reports
  for (int64_t id : e.queue) {
    const OpenSplit& o = open_.at(id);
    if (!o.awaiting.empty()) {
      waiting = true;
      continue;
    }
    *assign->mutable_split() = o.def;
    return true;
  }
  const int64_t begin = SkipDone(epoch, e.next_position);
  if (begin < positions_) {
    proto::SplitProto* def = assign->mutable_split();
    def->set_epoch(epoch);
    int64_t end = std::min(positions_, begin + split_elements_);
    auto resumed = resume_.find(epoch);
    if (resumed != resume_.end()) {
      auto r = resumed->second.lower_bound(begin);
      if (r != resumed->second.end() && r->first == begin) {
        // Cut as it was when saved, its delivered elements skipped.
        end = r->second.end;
        def->set_skip_prefix(r->second.delivered.prefix());
        def->set_skip(r->second.delivered.beyond());
      } else if (r != resumed->second.end()) {
        end = std::min(end, r->first);  // up to the next saved split
      }
    }
    // A file split is its positions in the sorted list (what seeds random
    // functions on its elements: SourceKey); NameFiles adds the names.
    def->set_begin(begin);
    def->set_end(end);
    assign->set_created(true);
    assign->set_next_position(end);
    return true;
  }
  if (e.open == 0 && !waiting) {
    resp->set_end_of_splits(true);
  } else {
    resp->set_not_ready(true);  // others hold the rest: one may be lost
  }
  return false;
}

void SplitProvider::NameFiles(proto::SplitProto* def) const {
  def->clear_file();
  def->clear_files();
  if (files_.empty()) return;
  const int64_t begin = std::clamp<int64_t>(def->begin(), 0, positions_);
  const int64_t end = std::clamp<int64_t>(def->end(), begin, positions_);
  if (end - begin == 1) {
    def->set_file(files_[static_cast<size_t>(begin)]);
  } else {
    for (int64_t p = begin; p < end; ++p) def->add_files(files_[static_cast<size_t>(p)]);
  }
}

void SplitProvider::Report(int64_t task, bool lost, const proto::GetSplitRequest& req,
                           proto::JournalRecord* rec) const {
  const std::set<int64_t>& held = Held(task);
  proto::CompleteSplitsUpdate completed;
  for (int64_t id : req.completed_splits()) {
    if (held.count(id)) completed.add_split_ids(id);
  }
  if (completed.split_ids_size() > 0) {
    completed.set_task_id(task);
    *rec->add_updates()->mutable_complete_splits() = std::move(completed);
  }
  if (!req.reports_held() || req.report_only() || lost) return;
  // Splits handed to this task whose reply never reached it.
  std::set<int64_t> reported(req.held_splits().begin(), req.held_splits().end());
  reported.insert(req.completed_splits().begin(), req.completed_splits().end());
  proto::RequeueSplitsUpdate requeue;
  for (int64_t id : held) {
    if (!reported.count(id)) requeue.add_split_ids(id);
  }
  if (requeue.split_ids_size() == 0) return;
  spdlog::warn("dispatcher: task {} never received split(s) {}; handing them out again", task,
               absl::StrJoin(requeue.split_ids(), ","));
  requeue.set_task_id(task);
  *rec->add_updates()->mutable_requeue_splits() = std::move(requeue);
}

absl::Status SplitProvider::ClientReport(int64_t iteration, int64_t client,
                                         const proto::ClientHeartbeatRequest& req,
                                         const std::vector<int64_t>& awaited,
                                         proto::JournalRecord* rec) {
  google::protobuf::RepeatedPtrField<proto::SplitProgress> reported = req.reported_splits();
  if (!req.reports_splits()) {
    for (int64_t id : awaited) reported.Add()->set_split_id(id);
  }
  if (reported.empty()) return absl::OkStatus();
  for (const proto::SplitProgress& p : reported) {
    if (!IndexSet::Valid(p.delivered_prefix(), p.delivered_beyond())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClientHeartbeat: reported_splits: split ", p.split_id(), "'s indices are out of bounds"));
    }
  }
  proto::SplitsReportedUpdate* u = rec->add_updates()->mutable_splits_reported();
  u->set_iteration_id(iteration);
  u->set_client_id(client);
  *u->mutable_splits() = std::move(reported);
  return absl::OkStatus();
}

absl::Status SplitProvider::Assign(const proto::AssignSplitUpdate& u) {
  const int64_t id = u.split().split_id();
  Epoch& e = epochs_[u.split().epoch()];
  if (u.created()) {
    if (open_.count(id)) return absl::AlreadyExistsError(absl::StrCat("split ", id, " exists"));
    OpenSplit o;
    o.def = u.split();
    open_.emplace(id, std::move(o));
    e.next_position = u.next_position();
    ++e.open;
  } else {
    auto q = std::find(e.queue.begin(), e.queue.end(), id);
    if (q == e.queue.end() || !open_.count(id)) {
      return absl::NotFoundError(absl::StrCat("split ", id, " is not queued"));
    }
    if (!open_.at(id).awaiting.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("split ", id, " waits for its clients' reports"));
    }
    e.queue.erase(q);
  }
  open_.at(id).holder_task = u.task_id();
  held_[u.task_id()].insert(id);
  return absl::OkStatus();
}

bool SplitProvider::Complete(int64_t task, int64_t split) {
  auto o = open_.find(split);
  // Unknown (completed before) or reassigned since: the report is stale.
  if (o == open_.end() || o->second.holder_task != task) return false;
  const int64_t epoch = o->second.def.epoch();
  open_.erase(o);
  auto h = held_.find(task);
  h->second.erase(split);
  if (h->second.empty()) held_.erase(h);
  auto e = epochs_.find(epoch);
  if (e != epochs_.end()) --e->second.open;
  // Forget epochs that completed, lowest first (a resumed epoch that was
  // all delivered never had a split: it completed too).
  while (true) {
    auto low = epochs_.find(done_below_);
    if (low == epochs_.end()) {
      if (resume_.empty() || SkipDone(done_below_, 0) < positions_) break;
      ++done_below_;
      continue;
    }
    const Epoch& ep = low->second;
    if (ep.open > 0 || !ep.queue.empty() || SkipDone(done_below_, ep.next_position) < positions_) {
      break;
    }
    epochs_.erase(low);
    ++done_below_;
  }
  return true;
}

void SplitProvider::Enqueue(std::map<int64_t, OpenSplit>::iterator o) {
  o->second.holder_task = 0;
  epochs_[o->second.def.epoch()].queue.push_front(o->first);
}

int64_t SplitProvider::Requeue(int64_t task, const std::set<int64_t>& ids,
                               const std::set<int64_t>& awaiting) {
  auto h = held_.find(task);
  if (h == held_.end()) return 0;
  int64_t n = 0;
  // Highest id first onto the front: the queue then hands them out in order.
  for (auto r = ids.rbegin(); r != ids.rend(); ++r) {
    if (!h->second.erase(*r)) continue;
    auto o = open_.find(*r);
    o->second.awaiting = awaiting;
    Enqueue(o);
    ++n;
  }
  if (h->second.empty()) held_.erase(h);
  return n;
}

int64_t SplitProvider::Release(int64_t task, bool requeue, int64_t* completed,
                               const std::set<int64_t>& awaiting) {
  auto h = held_.find(task);
  if (h == held_.end()) return 0;
  const std::set<int64_t> held = h->second;
  if (requeue) return Requeue(task, held, awaiting);
  for (int64_t id : held) *completed += Complete(task, id);
  return 0;
}

bool SplitProvider::Reported(int64_t client, int64_t split, const IndexSet& delivered) {
  auto o = open_.find(split);
  if (o == open_.end() || !o->second.awaiting.erase(client)) return false;
  proto::SplitProto& def = o->second.def;
  IndexSet skip(def.skip_prefix(), def.skip());
  skip.Merge(delivered);
  def.set_skip_prefix(skip.prefix());
  def.set_skip(skip.beyond());
  return true;
}

bool SplitProvider::ClientGone(int64_t client) {
  bool changed = false;
  for (auto& [id, o] : open_) changed |= o.awaiting.erase(client) > 0;
  return changed;
}

std::vector<int64_t> SplitProvider::AwaitingReport(int64_t client) const {
  std::vector<int64_t> ids;
  for (const auto& [id, o] : open_) {
    if (o.awaiting.count(client)) ids.push_back(id);
  }
  return ids;
}

void SplitProvider::Restore(const proto::SplitProviderStateUpdate& u) {
  done_below_ = u.done_below();
  epochs_.clear();
  for (const auto& es : u.epochs()) {
    Epoch& e = epochs_[es.epoch()];
    e.queue.assign(es.queue().begin(), es.queue().end());
    e.next_position = es.next_position();
    e.open = es.open();
  }
  open_.clear();
  held_.clear();
  for (const auto& os : u.open()) {
    const int64_t id = os.split().split_id();
    open_[id] = OpenSplit{os.split(), os.holder_task(),
                          {os.awaiting_clients().begin(), os.awaiting_clients().end()}};
    if (os.holder_task() != 0) held_[os.holder_task()].insert(id);
  }
}

void SplitProvider::Save(proto::SplitProviderStateUpdate* u) const {
  u->set_done_below(done_below_);
  for (const auto& [e, ep] : epochs_) {
    auto* es = u->add_epochs();
    es->set_epoch(e);
    for (int64_t q : ep.queue) es->add_queue(q);
    es->set_next_position(ep.next_position);
    es->set_open(ep.open);
  }
  for (const auto& [sid, o] : open_) {
    auto* os = u->add_open();
    *os->mutable_split() = o.def;
    os->set_holder_task(o.holder_task);
    for (int64_t c : o.awaiting) os->add_awaiting_clients(c);
  }
}

const std::set<int64_t>& SplitProvider::Held(int64_t task) const {
  static const std::set<int64_t> kNone;
  auto h = held_.find(task);
  return h == held_.end() ? kNone : h->second;
}

std::optional<int64_t> SplitProvider::LowestOpen() const {
  if (open_.empty()) return std::nullopt;
  return open_.begin()->first;
}

}  // namespace sluice::internal
