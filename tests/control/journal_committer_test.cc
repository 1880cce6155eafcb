// Tests of the journal committer's replies (control/journal_committer.h):
// a queued reply goes out only once what it saw is durable, and a failed
// write fails every pending reply.
#include "sluice/control/journal_committer.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A committer over a journal in a temporary folder, driven by the test as
// the dispatcher's poll thread drives it.
class Committer {
 public:
  Committer()
      : c_([] { return [] { return std::vector<proto::JournalRecord>{}; }; }, [] {}) {
    absl::MutexLock l(&mu_);
    status_ = c_.Open(dir_.path(), FsyncPolicy::kEveryRecord, 0);
  }

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  JournalCommitter& c() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return c_; }
  const absl::Status& open_status() const { return status_; }

  // A record applied, and a reply that records `name` (and its status)
  // when it is sent, after `before` runs.
  void QueueWithReply(const std::string& name, std::function<void()> before = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::JournalRecord rec;
    rec.add_updates()->mutable_remove_worker()->set_address(name);
    c_.Queue(rec.SerializeAsString());
    c_.QueueReply(
        [this, name, before = std::move(before)](absl::Status s) {
          if (before) before();
          absl::MutexLock l(&sent_mu_);
          sent_.push_back(s.ok() ? name : name + ": " + std::string(s.message()));
        },
        absl::OkStatus());
  }

  std::vector<std::string> SentWithin(size_t n, absl::Duration timeout) {
    absl::MutexLock l(&sent_mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sent_mu_) { return sent_.size() >= n; };
    sent_mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return sent_;
  }

 private:
  sluice_test::TempDir dir_;
  absl::Mutex mu_;
  JournalCommitter c_ ABSL_GUARDED_BY(mu_);
  absl::Status status_;
  absl::Mutex sent_mu_;
  std::vector<std::string> sent_ ABSL_GUARDED_BY(sent_mu_);
};

TEST(JournalCommitterTest, AReplyWaitsForTheWriteOfWhatItSaw) {
  Committer t;
  ASSERT_OK(t.open_status());
  absl::Notification in_write, release_write;
  {
    absl::MutexLock l(&t.mu());
    t.c().SetFaultHookForTesting(t.mu(), [&](JournalWriter::Stage s) {
      if (s != JournalWriter::Stage::kBeforeSync || in_write.HasBeenNotified()) return;
      in_write.Notify();
      release_write.WaitForNotification();
    });
    t.QueueWithReply("a");
    t.QueueWithReply("b");
  }
  // The poll thread's part: write, then send the replies now durable.
  std::thread poll([&] {
    absl::MutexLock l(&t.mu());
    t.c().SendReplies(t.mu());
  });
  ASSERT_TRUE(in_write.WaitForNotificationWithTimeout(absl::Seconds(30)));
  {
    absl::MutexLock l(&t.mu());  // the writer released it
    EXPECT_FALSE(t.c().Durable(1));
  }
  EXPECT_THAT(t.SentWithin(1, absl::Milliseconds(200)), ::testing::IsEmpty());
  release_write.Notify();
  poll.join();
  EXPECT_THAT(t.SentWithin(2, absl::Seconds(30)), ElementsAre("a", "b"));
}

TEST(JournalCommitterTest, AFailedWriteFailsEveryPendingReply) {
  Committer t;
  ASSERT_OK(t.open_status());
  {
    absl::MutexLock l(&t.mu());
    // The journal's descriptor becomes /dev/full's: the append fails.
    const std::filesystem::path journal = std::filesystem::canonical(t.c().path());
    t.c().SetFaultHookForTesting(t.mu(), [journal](JournalWriter::Stage s) {
      if (s != JournalWriter::Stage::kBeforeWrite) return;
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        if (std::filesystem::read_symlink(e.path(), ec) != journal || ec) continue;
        const int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
        ASSERT_GE(full, 0);
        ASSERT_GE(dup2(full, std::stoi(e.path().filename().string())), 0);
        close(full);
      }
    });
    t.QueueWithReply("a");
    t.QueueWithReply("b");
    ASSERT_TRUE(t.c().SendReplies(t.mu()));
    EXPECT_FALSE(t.c().error().ok());
    EXPECT_FALSE(t.c().Durable(2));
  }
  const std::vector<std::string> sent = t.SentWithin(2, absl::Seconds(30));
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_THAT(sent[0], HasSubstr("a: the dispatcher cannot journal changes"));
  EXPECT_THAT(sent[1], HasSubstr("b: the dispatcher cannot journal changes"));
}

}  // namespace
}  // namespace sluice::internal
