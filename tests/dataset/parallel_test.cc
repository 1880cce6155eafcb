// Parallel Map, Interleave and Batch on the process-wide pool: the same
// elements as sequential runs, order, errors at their position,
// cancellation, and the pool itself.
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <thread>
#include <vector>

#include "dataset/dataset.pb.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/udf.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice {
namespace {

using ::sluice_test::Collect;
using ::sluice_test::CollectScalars;
using ::sluice_test::WithHangGuard;
using ::testing::ElementsAreArray;
using ::testing::UnorderedElementsAreArray;
using expr::x;

std::atomic<int64_t> g_running{0}, g_calls{0};

// v -> v * v after a delay that varies with v (so parallel calls finish out
// of order); v == 0 takes longest.
absl::StatusOr<Element> Jitter(const Element& in) {
  g_running++;
  g_calls++;
  const int64_t v = in[0].at<int64_t>(0);
  const int64_t us = v == 0 ? 30000 : (v * 7919) % 7 * 150;
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  g_running--;
  return Element{Tensor::Scalar<int64_t>(v * v)};
}
SLUICE_REGISTER_UDF(test_jitter, Jitter, {.num_inputs = 1, .output_dtypes = {{DType::kInt64}}});

// Element 0 waits (up to 10 s) for g_gate; the others pass at once.
std::atomic<bool> g_gate{false};
absl::StatusOr<Element> Gated(const Element& in) {
  const int64_t v = in[0].at<int64_t>(0);
  for (int i = 0; v == 0 && !g_gate.load() && i < 10000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Element{Tensor::Scalar<int64_t>(v)};
}
SLUICE_REGISTER_UDF(test_gated, Gated, {.num_inputs = 1, .output_dtypes = {{DType::kInt64}}});

absl::StatusOr<Element> FailAtFifty(const Element& in) {
  const int64_t v = in[0].at<int64_t>(0);
  std::this_thread::sleep_for(std::chrono::microseconds((v * 31) % 5 * 100));
  if (v == 50) return absl::FailedPreconditionError("fifty is not allowed");
  return in;
}
SLUICE_REGISTER_UDF(test_fail_at_fifty, FailAtFifty,
                    {.num_inputs = 1, .output_dtypes = {{DType::kInt64}}});

std::vector<int64_t> Squares(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i * i);
  return v;
}

TEST(ParallelMapTest, DeterministicRunsGiveTheSequentialElementsInOrder) {
  for (int64_t calls : {int64_t{2}, int64_t{4}, kAutotune}) {
    Dataset ds = Dataset::Range(120).Map(Udf("test_jitter"), calls);
    ASSERT_OK(ds.status());
    ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(ds));
    EXPECT_THAT(v, ElementsAreArray(Squares(120))) << "num_parallel_calls " << calls;
  }
  // Expressions too (under kAutotune these cheap calls move onto the
  // consumer's thread after the first ones), and the definition says what
  // was asked.
  for (int64_t calls : {int64_t{3}, kAutotune}) {
    Dataset expr = Dataset::Range(1000).Map(x * 3 + 1, calls);
    EXPECT_EQ(expr.def().root().map().num_parallel_calls(), calls);
    ASSERT_OK_AND_ASSIGN(auto e, CollectScalars<int64_t>(expr));
    ASSERT_EQ(e.size(), 1000u);
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(e[i], i * 3 + 1) << "num_parallel_calls " << calls;
  }
  // num_parallel_calls = 1 is the sequential Map, with the same definition.
  EXPECT_EQ(Dataset::Range(5).Map(x + 1, 1).Fingerprint(), Dataset::Range(5).Map(x + 1).Fingerprint());
}

TEST(ParallelMapTest, NondeterministicYieldsWhatIsReadyFirst) {
  Dataset ds = Dataset::Range(40).Map(Udf("test_jitter"), 4, /*deterministic=*/false);
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(ds));
  EXPECT_THAT(v, UnorderedElementsAreArray(Squares(40)));
  // Element 0's call is held until another element was delivered: only a
  // nondeterministic Map can deliver one (a deterministic one would wait
  // out the gate's 10 s and yield 0 first).
  g_gate = false;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(8).Map(Udf("test_gated"), 4, false).MakeIterator());
  auto first = it->Next();
  g_gate = true;
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_NE((**first)[0].at<int64_t>(0), 0);
  std::vector<int64_t> rest{(**first)[0].at<int64_t>(0)};
  while (true) {
    auto e = it->Next();
    ASSERT_OK(e);
    if (!e->has_value()) break;
    rest.push_back((**e)[0].at<int64_t>(0));
  }
  EXPECT_THAT(rest, UnorderedElementsAreArray({0, 1, 2, 3, 4, 5, 6, 7}));
  // Deterministic keeps the input's order.
  ASSERT_OK_AND_ASSIGN(auto d, CollectScalars<int64_t>(Dataset::Range(40).Map(Udf("test_jitter"), 4)));
  EXPECT_EQ(d[0], 0);
}

TEST(ParallelMapTest, AnErrorSurfacesAtItsPositionAndNothingAfterIt) {
  for (int64_t calls : {int64_t{1}, int64_t{4}, kAutotune}) {
    ASSERT_OK_AND_ASSIGN(auto it,
                         Dataset::Range(200).Map(Udf("test_fail_at_fifty"), calls).MakeIterator());
    for (int64_t i = 0; i < 50; ++i) {
      auto e = it->Next();
      ASSERT_OK(e);
      ASSERT_TRUE(e->has_value());
      ASSERT_EQ((**e)[0].at<int64_t>(0), i) << "num_parallel_calls " << calls;
    }
    for (int k = 0; k < 3; ++k) {  // sticky
      EXPECT_STATUS(it->Next(), absl::StatusCode::kFailedPrecondition, "fifty is not allowed");
    }
  }
  // Nondeterministic: the error arrives, and nothing is delivered after it.
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(200)
                                    .Map(Udf("test_fail_at_fifty"), 4, false)
                                    .MakeIterator());
  int64_t before = 0;
  while (true) {
    auto e = it->Next();
    if (!e.ok()) {
      EXPECT_STATUS(e, absl::StatusCode::kFailedPrecondition, "fifty");
      break;
    }
    ASSERT_TRUE(e->has_value()) << "ended without the error";
    ++before;
  }
  EXPECT_LT(before, 200);
  EXPECT_STATUS(it->Next(), absl::StatusCode::kFailedPrecondition, "fifty");
}

TEST(ParallelMapTest, DestroyingTheIteratorStopsItsCalls) {
  for (bool deterministic : {true, false}) {
    {
      ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1000000)
                                        .Map(Udf("test_jitter"), 8, deterministic)
                                        .MakeIterator());
      for (int i = 0; i < 5; ++i) ASSERT_OK(it->Next());
      WithHangGuard([&] { it.reset(); });
    }
    // No call runs once the destructor returned, and none starts later.
    EXPECT_EQ(g_running.load(), 0);
    const int64_t calls = g_calls.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(g_calls.load(), calls);
  }
}

TEST(ParallelMapTest, BadParallelismIsInvalidArgument) {
  EXPECT_STATUS(Dataset::Range(3).Map(x + 1, 0).status(), absl::StatusCode::kInvalidArgument,
                "Map: num_parallel_calls must be in [1, 1024] or kAutotune; got 0");
  EXPECT_STATUS(Dataset::Range(3).Map(x + 1, -5).status(), absl::StatusCode::kInvalidArgument,
                "got -5");
  EXPECT_STATUS(Dataset::Range(3).Batch(2, false, 5000).status(),
                absl::StatusCode::kInvalidArgument, "Batch: num_parallel_calls");
  EXPECT_STATUS(Dataset::Range(3).Interleave([](const Dataset& d) { return d; }, 2, 1, 0).status(),
                absl::StatusCode::kInvalidArgument, "Interleave: num_parallel_calls");
  EXPECT_STATUS(Dataset::Range(3).Prefetch(-2).status(), absl::StatusCode::kInvalidArgument,
                "buffer_size must be > 0 or kAutotune");
}

// A parallel Map reads ahead of its output across split boundaries, so
// the worker (which tags an element with the split its source is reading
// when the element comes out, unless a Prefetch says which split it read
// the element from) cannot tie its output to splits; and ops that count
// across splits keep a service checkpoint from resuming.
TEST(ParallelMapTest, AParallelMapKeepsTheTieToSplitsUnlessItReorders) {
  auto info = [](const Dataset& ds) {
    auto i = internal::FindSplitSource(ds.def().root());
    EXPECT_OK(i.status());
    return i.value_or(internal::SplitSourceInfo{});
  };
  // A deterministic parallel Map reads ahead, tracked; a nondeterministic
  // one reorders.
  const auto parallel = info(Dataset::Range(10).Map(x + 1, 4));
  EXPECT_TRUE(parallel.tracked);
  EXPECT_TRUE(parallel.reads_ahead);
  EXPECT_EQ(parallel.unresumable_op, nullptr);
  EXPECT_FALSE(info(Dataset::Range(10).Map(x + 1, 4, false)).tracked);
  EXPECT_STREQ(info(Dataset::Range(10).Map(x + 1, 4, false)).unresumable_op, "Map");
  EXPECT_TRUE(info(Dataset::Range(10).Map(x + 1, 1, false)).tracked);
  EXPECT_EQ(info(Dataset::Range(10).Map(x + 1).Filter(x > 2)).unresumable_op, nullptr);
  // Prefetches read ahead, tracked, one after the other too (tf.data's
  // map(num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)).
  const auto prefetched = info(Dataset::Range(10).Filter(x > 2).Prefetch(4).Map(x + 1));
  EXPECT_EQ(prefetched.unresumable_op, nullptr);
  EXPECT_TRUE(prefetched.tracked);
  EXPECT_TRUE(prefetched.reads_ahead);
  EXPECT_FALSE(info(Dataset::Range(10).Map(x + 1)).reads_ahead);
  const auto stacked =
      info(Dataset::Range(10).Prefetch(2).Map(x + 1, kAutotune).Prefetch(kAutotune));
  EXPECT_EQ(stacked.unresumable_op, nullptr);
  EXPECT_TRUE(stacked.tracked);
  EXPECT_STREQ(info(Dataset::Range(10).Take(4).Map(x + 1)).unresumable_op, "Take");
  EXPECT_TRUE(info(Dataset::Range(10).Take(4)).tracked);  // dedup still works
  EXPECT_STREQ(info(Dataset::Range(10).Batch(2).Shard(2, 0)).unresumable_op, "Shard");
}

// A split source that hands out [0, 5) and [5, 10), and ends the epoch (as
// the dispatcher does) only once no read-ahead op holds an element of
// them; it records each element a pipeline op took and released.
class GatedSplits : public internal::SplitSource {
 public:
  int64_t BeginEpoch() override { return 0; }
  absl::StatusOr<std::optional<internal::Split>> Next(int64_t) override {
    absl::MutexLock l(&mu_);
    if (handed_ < 2) {
      internal::Split s;
      s.id = handed_ + 1;
      s.begin = 5 * handed_;
      s.end = s.begin + 5;
      ++handed_;
      return std::optional<internal::Split>(s);
    }
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&settled), absl::Seconds(30))) {
      return absl::DeadlineExceededError("the epoch never ended: elements stayed held");
    }
    return std::optional<internal::Split>();
  }
  bool EpochHadSplits(int64_t) override { return true; }
  void ReadAhead(int64_t split) override {
    if (split < 0) return;  // none
    absl::MutexLock l(&mu_);
    ++held_;
    ++took_[split];
    max_held_ = std::max(max_held_, held_);
  }
  void Released(int64_t split) override {
    if (split < 0) return;
    absl::MutexLock l(&mu_);
    --held_;
    ++released_[split];
  }
  int64_t max_held() {
    absl::MutexLock l(&mu_);
    return max_held_;
  }
  std::map<int64_t, int64_t> took() {
    absl::MutexLock l(&mu_);
    return took_;
  }
  std::map<int64_t, int64_t> released() {
    absl::MutexLock l(&mu_);
    return released_;
  }

 private:
  absl::Mutex mu_;
  int64_t handed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0, max_held_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, int64_t> took_ ABSL_GUARDED_BY(mu_), released_ ABSL_GUARDED_BY(mu_);
};

// On a worker (distributed_epoch), a deterministic parallel Map and a
// Prefetch read ahead of their output across split ends: each element
// keeps the split it came from (ElementSplit, as the worker tags it), each
// op says what it holds, and the parallel Map reads its input on a thread
// of its own, so the consumer drains it while that thread waits for the
// epoch's end (on the consumer's thread the epoch would never end).
TEST(ParallelMapTest, OnSplitsItReadsAheadOnItsOwnThreadAndKeepsEachElementsSplit) {
  for (const bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "Map(4).Prefetch(3)" : "Map(4)");
    GatedSplits splits;
    Dataset ds = Dataset::Range(10).Map(x * 10, 4);
    if (prefetch) ds = ds.Prefetch(3);
    ASSERT_OK(ds.status());
    internal::IteratorContext ctx;
    ctx.splits = &splits;
    ASSERT_OK_AND_ASSIGN(auto it, internal::MakeNodeIterator(ds.rep()->analysis, ctx));
    std::vector<int64_t> values, of_split;
    WithHangGuard([&] {
      while (true) {
        auto e = it->Next();
        ASSERT_OK(e.status());
        if (!e->has_value()) break;
        values.push_back((**e)[0].at<int64_t>(0));
        of_split.push_back(it->ElementSplit());
        if (values.size() == 1) {
          // The op reads ahead while this consumer waits.
          const absl::Time deadline = absl::Now() + absl::Seconds(30);
          while (splits.max_held() < 3 && absl::Now() < deadline) {
            absl::SleepFor(absl::Milliseconds(1));
          }
        }
      }
    });
    EXPECT_THAT(values, ElementsAreArray({0, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
    EXPECT_THAT(of_split, ElementsAreArray({1, 1, 1, 1, 1, 2, 2, 2, 2, 2}));
    EXPECT_GE(splits.max_held(), 3) << "nothing was read ahead";
    // Each op took and released each element once.
    const std::map<int64_t, int64_t> each = {{1, prefetch ? 10 : 5}, {2, prefetch ? 10 : 5}};
    EXPECT_EQ(splits.took(), each);
    EXPECT_EQ(splits.released(), each);
  }
}

// tf.data: range(1,6).interleave(lambda v: repeat(v, 3), cycle_length=3,
// block_length=2), now with the slots read ahead in parallel.
TEST(ParallelInterleaveTest, GivesTheSequentialOrder) {
  auto fn = [](const Dataset& e) { return e.Repeat(3); };
  for (int64_t calls : {int64_t{2}, int64_t{3}, kAutotune}) {
    ASSERT_OK_AND_ASSIGN(auto w, CollectScalars<int64_t>(Dataset::Range(1, 6).Interleave(fn, 3, 2, calls)));
    EXPECT_THAT(w, ElementsAreArray({1, 1, 2, 2, 3, 3, 1, 2, 3, 4, 4, 5, 5, 4, 5}));
  }
  // Per-element datasets doing slow work that finishes out of order.
  auto ranged = [](const Dataset& e) { return e.Repeat(4).Map(Udf("test_jitter")); };
  ASSERT_OK_AND_ASSIGN(auto seq, CollectScalars<int64_t>(Dataset::Range(1, 30).Interleave(ranged, 4, 3)));
  ASSERT_OK_AND_ASSIGN(auto par, CollectScalars<int64_t>(
                                     Dataset::Range(1, 30).Interleave(ranged, 4, 3, kAutotune)));
  EXPECT_EQ(par, seq);
  EXPECT_EQ(par.size(), 29u * 4);
}

TEST(ParallelInterleaveTest, AnErrorSurfacesAtItsPosition) {
  // Slots over 40..59, each three times; 50's slot fails when read.
  auto fn = [](const Dataset& e) { return e.Repeat(3).Map(Udf("test_fail_at_fifty")); };
  auto until_error = [&](int64_t calls) {
    std::vector<int64_t> got;
    auto it = Dataset::Range(40, 60).Interleave(fn, 4, 2, calls).MakeIterator();
    EXPECT_OK(it.status());
    if (!it.ok()) return got;
    while (true) {
      auto e = (*it)->Next();
      if (!e.ok()) {
        EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << calls;
        return got;
      }
      EXPECT_TRUE(e->has_value()) << "ended without the error";
      if (!e->has_value()) return got;
      got.push_back((**e)[0].at<int64_t>(0));
    }
  };
  const std::vector<int64_t> sequential = until_error(1);
  EXPECT_GE(sequential.size(), 20u);  // slots of 40..49 read before 50's
  for (int64_t calls : {int64_t{2}, int64_t{4}, kAutotune}) {
    EXPECT_EQ(until_error(calls), sequential) << "num_parallel_calls " << calls;
  }
}

TEST(ParallelInterleaveTest, DestroyingTheIteratorMidStreamReturns) {
  auto fn = [](const Dataset& e) { return Dataset::Range(1000000).Map(Udf("test_jitter")); };
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(8).Interleave(fn, 4, 8, 4).MakeIterator());
  for (int i = 0; i < 20; ++i) ASSERT_OK(it->Next());
  WithHangGuard([&] { it.reset(); });
  EXPECT_EQ(g_running.load(), 0);
}

// A one-thread pool running an Interleave whose datasets have parallel
// Maps: waiters run queued work themselves, so nothing deadlocks.
TEST(ThreadPoolTest, NestedParallelOpsOnOneThreadDoNotDeadlock) {
  ConfigureThreadPool(1);
  EXPECT_EQ(ThreadPoolSize(), 1);
  EXPECT_EQ(internal::ResolveParallelism(kAutotune), 1);
  auto fn = [](const Dataset& e) { return e.Repeat(5).Map(x * 2, 4); };
  auto v = WithHangGuard(
      [&] { return CollectScalars<int64_t>(Dataset::Range(20).Interleave(fn, 4, 2, 4).Map(x + 1, 3)); });
  ASSERT_OK(v);
  EXPECT_EQ(v->size(), 100u);
  ConfigureThreadPool(3);
  EXPECT_EQ(ThreadPoolSize(), 3);
  EXPECT_EQ(internal::ResolveParallelism(kAutotune), 3);
  EXPECT_EQ(internal::ResolveParallelism(2), 2);
  // A thread init reaches every thread, those already running included.
  static std::atomic<int> inits{0};  // outlives any thread still applying it
  ConfigureThreadPool(3, [] { inits++; });
  for (int i = 0; i < 500 && inits.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(inits.load(), 3);
  ConfigureThreadPool(AvailableCpus(), [] {});
  EXPECT_GE(AvailableCpus(), 1);
}

TEST(ParallelBatchTest, ParallelCopiesGiveTheSameBatches) {
  // 8 MiB batches: the copy is split over the pool.
  std::vector<Element> rows;
  for (int i = 0; i < 16; ++i) {
    auto t = Tensor::Allocate(DType::kFloat32, TensorShape({256, 1024}));
    ASSERT_OK(t);
    float* p = reinterpret_cast<float*>(t->mutable_data());
    for (int64_t k = 0; k < 256 * 1024; ++k) p[k] = static_cast<float>(i * 1000003 + k);
    rows.push_back(Element{*std::move(t)});
  }
  Dataset src = Dataset::FromTensors(rows);
  for (int64_t calls : {int64_t{4}, kAutotune}) {
    ASSERT_OK_AND_ASSIGN(auto par, Collect(src.Batch(8, false, calls)));
    ASSERT_OK_AND_ASSIGN(auto seq, Collect(src.Batch(8)));
    ASSERT_EQ(par.size(), 2u);
    for (size_t b = 0; b < par.size(); ++b) {
      ASSERT_EQ(par[b][0].shape(), seq[b][0].shape());
      ASSERT_EQ(std::memcmp(par[b][0].data(), seq[b][0].data(), seq[b][0].byte_size()), 0);
    }
  }
  // Strings and a short last batch.
  ASSERT_OK_AND_ASSIGN(auto small, CollectScalars<int64_t>(Dataset::Range(10).Batch(4, false, 2).Unbatch()));
  EXPECT_THAT(small, ElementsAreArray({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(PrefetchTest, AutotunedBufferKeepsOrder) {
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(500).Prefetch(kAutotune)));
  ASSERT_EQ(v.size(), 500u);
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(v[i], i);
}

}  // namespace
}  // namespace sluice
