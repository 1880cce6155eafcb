// The local executor: one Iterator class per dataset op.

#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/tfrecord.h"

namespace sluice::internal {
namespace {

using Result = absl::StatusOr<std::optional<Element>>;
using AnalysisPtr = std::shared_ptr<const Analysis>;

Result End() { return std::optional<Element>(); }
Result Some(Element e) { return std::optional<Element>(std::move(e)); }

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// Holds the analysis (and so the definition) alive for the iterator's life.
class NodeIterator : public Iterator {
 public:
  explicit NodeIterator(AnalysisPtr a) : a_(std::move(a)) {}

 protected:
  const proto::DatasetNode& node() const { return *a_->node; }
  AnalysisPtr a_;
};

// An op with one input iterator.
class UnaryIterator : public NodeIterator {
 public:
  UnaryIterator(AnalysisPtr a, std::unique_ptr<Iterator> in)
      : NodeIterator(std::move(a)), in_(std::move(in)) {}

 protected:
  std::unique_ptr<Iterator> in_;
};

class RangeIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    const auto& r = node().range();
    if (!started_) {
      cur_ = r.start();
      started_ = true;
    }
    if ((r.step() > 0 && cur_ >= r.stop()) || (r.step() < 0 && cur_ <= r.stop()) || done_) {
      return End();
    }
    int64_t v = cur_;
    if (__builtin_add_overflow(cur_, r.step(), &cur_)) done_ = true;
    return Some({Tensor::Scalar<int64_t>(v)});
  }

 private:
  bool started_ = false, done_ = false;
  int64_t cur_ = 0;
};

class FromTensorsIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    if (i_ >= a_->elements.size()) return End();
    return Some(a_->elements[i_++]);
  }

 private:
  size_t i_ = 0;
};

// A Range, FromTensors or ListFiles source under dynamic sharding: yields
// the elements of the splits it gets from ctx.splits, one split after the
// other.
class SplitReaderIterator : public NodeIterator {
 public:
  SplitReaderIterator(AnalysisPtr a, SplitSource* splits)
      : NodeIterator(std::move(a)), splits_(splits), epoch_(splits->BeginEpoch()) {}
  Result Next() override {
    while (true) {
      if (split_ && pos_ < split_->end) {
        const int64_t pos = pos_++;
        switch (node().op_case()) {
          case proto::DatasetNode::kRange: {
            const auto& r = node().range();
            return Some({Tensor::Scalar<int64_t>(
                static_cast<int64_t>(static_cast<__int128>(r.start()) +
                                     static_cast<__int128>(pos) * r.step()))});
          }
          case proto::DatasetNode::kFromTensors:
            if (pos < 0 || pos >= static_cast<int64_t>(a_->elements.size())) {
              return absl::OutOfRangeError(absl::StrCat(
                  "split ", split_->id, " names element ", pos, " of a FromTensors source with ",
                  a_->elements.size()));
            }
            return Some(a_->elements[pos]);
          case proto::DatasetNode::kListFiles:
            return Some({Tensor::String(split_->file)});
          default:
            return absl::InternalError("split reader over a source that cannot be split");
        }
      }
      SLUICE_ASSIGN_OR_RETURN(split_, splits_->Next(epoch_));
      if (!split_) return End();
      pos_ = split_->begin;
    }
  }

 private:
  SplitSource* const splits_;
  const int64_t epoch_;
  std::optional<Split> split_;
  int64_t pos_ = 0;
};

class PlaceholderIterator : public NodeIterator {
 public:
  PlaceholderIterator(AnalysisPtr a, Element e) : NodeIterator(std::move(a)), e_(std::move(e)) {}
  Result Next() override {
    if (done_) return End();
    done_ = true;
    return Some(std::move(e_));
  }

 private:
  Element e_;
  bool done_ = false;
};

class ListFilesIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    if (!listed_) {
      listed_ = true;
      SLUICE_ASSIGN_OR_RETURN(files_, GlobFiles(node().list_files().pattern()));
    }
    if (i_ >= files_.size()) return End();
    return Some({Tensor::String(files_[i_++])});
  }

 private:
  bool listed_ = false;
  std::vector<std::string> files_;
  size_t i_ = 0;
};

// Base for file readers: pulls file names from the input and opens each.
class FileReaderIterator : public NodeIterator {
 public:
  FileReaderIterator(AnalysisPtr a, std::unique_ptr<Iterator> files)
      : NodeIterator(std::move(a)), files_(std::move(files)) {}

 protected:
  // The next file name, nullopt when the input is exhausted.
  absl::StatusOr<std::optional<std::string>> NextFile(absl::string_view op) {
    while (pending_.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto e, files_->Next());
      if (!e) return std::optional<std::string>();
      if (e->size() != 1 || (*e)[0].dtype() != DType::kString || (*e)[0].shape().rank() > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": filenames must be string scalars or vectors; got ",
                         ElementDebugString(*e)));
      }
      const Tensor& t = (*e)[0];
      for (int64_t i = 0; i < t.num_elements(); ++i) pending_.emplace_back(t.str(i));
    }
    std::string f = std::move(pending_.front());
    pending_.pop_front();
    return std::optional<std::string>(std::move(f));
  }

 private:
  std::unique_ptr<Iterator> files_;
  std::deque<std::string> pending_;
};

class ReadRecordsIterator : public FileReaderIterator {
 public:
  using FileReaderIterator::FileReaderIterator;
  Result Next() override {
    while (true) {
      if (reader_ == nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto f, NextFile("ReadRecords"));
        if (!f) return End();
        SLUICE_ASSIGN_OR_RETURN(reader_, TFRecordReader::Open(*f));
      }
      SLUICE_ASSIGN_OR_RETURN(auto rec, reader_->Next());
      if (rec) return Some({Tensor::String(*rec)});
      reader_.reset();
    }
  }

 private:
  std::unique_ptr<TFRecordReader> reader_;
};

class FixedLengthIterator : public FileReaderIterator {
 public:
  using FileReaderIterator::FileReaderIterator;
  ~FixedLengthIterator() override {
    if (f_) std::fclose(f_);
  }
  Result Next() override {
    const auto& r = node().read_fixed_length_records();
    while (true) {
      if (f_ == nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto name, NextFile("ReadFixedLengthRecords"));
        if (!name) return End();
        SLUICE_RETURN_IF_ERROR(Open(*name, r));
      }
      if (remaining_ > 0) {
        std::string rec(r.record_bytes(), '\0');
        if (std::fread(rec.data(), 1, rec.size(), f_) != rec.size()) {
          return absl::DataLossError(absl::StrCat("ReadFixedLengthRecords: short read in '",
                                                  path_, "'"));
        }
        --remaining_;
        return Some({Tensor::String(rec)});
      }
      std::fclose(f_);
      f_ = nullptr;
    }
  }

 private:
  absl::Status Open(const std::string& name, const proto::DatasetNode::ReadFixedLengthRecords& r) {
    path_ = name;
    f_ = std::fopen(name.c_str(), "rb");
    if (f_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("ReadFixedLengthRecords: cannot open '", name,
                                              "': ", std::strerror(errno)));
    }
    std::fseek(f_, 0, SEEK_END);
    int64_t size = std::ftell(f_);
    int64_t body = size - r.header_bytes() - r.footer_bytes();
    if (body < 0 || body % r.record_bytes() != 0) {
      return absl::DataLossError(absl::StrCat(
          "ReadFixedLengthRecords: '", name, "' has ", size, " bytes, which is not header ",
          r.header_bytes(), " + footer ", r.footer_bytes(), " + a multiple of ",
          r.record_bytes()));
    }
    remaining_ = body / r.record_bytes();
    std::fseek(f_, r.header_bytes(), SEEK_SET);
    return absl::OkStatus();
  }

  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t remaining_ = 0;
};

class MapIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
    if (!e) return End();
    SLUICE_ASSIGN_OR_RETURN(Element out, a_->fn->Apply(*e));
    return Some(std::move(out));
  }

};

class FilterIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      SLUICE_ASSIGN_OR_RETURN(Element keep, a_->fn->Apply(*e));
      if (keep.size() != 1 || keep[0].dtype() != DType::kBool || !keep[0].shape().is_scalar()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Filter: predicate must yield one bool scalar; it yielded ", ElementDebugString(keep)));
      }
      if (keep[0].data()[0] != 0) return Some(std::move(*e));
    }
  }

};

// Stacks equal-shaped tensors along a new leading dimension.
absl::StatusOr<Tensor> Stack(const std::vector<const Tensor*>& parts, size_t component) {
  const Tensor& first = *parts[0];
  std::vector<int64_t> dims = first.shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(parts.size()));
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i]->dtype() != first.dtype() || parts[i]->shape() != first.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Batch: component ", component, " of batch element ", i, " is ",
          DTypeName(parts[i]->dtype()), parts[i]->shape().ToString(), " but element 0's is ",
          DTypeName(first.dtype()), first.shape().ToString(),
          "; Batch needs equal shapes (Map them to a common shape first)"));
    }
  }
  if (first.dtype() == DType::kString) {
    std::vector<std::string_view> strs;
    for (const Tensor* t : parts) {
      for (int64_t k = 0; k < t->num_elements(); ++k) strs.push_back(t->str(k));
    }
    return MakeStringTensor(strs, TensorShape(std::move(dims)));
  }
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(first.dtype(), TensorShape(std::move(dims))));
  size_t off = 0;
  for (const Tensor* t : parts) {
    if (t->byte_size()) std::memcpy(out.mutable_data() + off, t->data(), t->byte_size());
    off += t->byte_size();
  }
  return out;
}

class BatchIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    const auto& b = node().batch();
    std::vector<Element> batch;
    while (static_cast<int64_t>(batch.size()) < b.batch_size()) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) break;
      if (!batch.empty() && e->size() != batch[0].size()) {
        return absl::InvalidArgumentError(absl::StrCat("Batch: elements have ", batch[0].size(),
                                                       " and ", e->size(), " components"));
      }
      batch.push_back(std::move(*e));
    }
    if (batch.empty() || (b.drop_remainder() && static_cast<int64_t>(batch.size()) < b.batch_size())) {
      return End();
    }
    Element out;
    for (size_t c = 0; c < batch[0].size(); ++c) {
      std::vector<const Tensor*> parts;
      for (const auto& e : batch) parts.push_back(&e[c]);
      SLUICE_ASSIGN_OR_RETURN(Tensor t, Stack(parts, c));
      out.push_back(std::move(t));
    }
    return Some(std::move(out));
  }

};

// Row i of `t` along dimension 0: a view for fixed-width dtypes.
absl::StatusOr<Tensor> Row(const Tensor& t, int64_t i) {
  std::vector<int64_t> dims(t.shape().dims().begin() + 1, t.shape().dims().end());
  TensorShape shape(dims);
  int64_t per = shape.num_elements();
  if (t.dtype() == DType::kString) {
    std::vector<std::string_view> strs;
    for (int64_t k = 0; k < per; ++k) strs.push_back(t.str(i * per + k));
    return MakeStringTensor(strs, std::move(shape));
  }
  size_t row_bytes = static_cast<size_t>(per) * DTypeSize(t.dtype());
  return Tensor::View(t.dtype(), std::move(shape), t.data() + i * row_bytes, row_bytes, t.owner());
}

class UnbatchIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    while (row_ >= rows_) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      rows_ = -1;
      for (size_t c = 0; c < e->size(); ++c) {
        const Tensor& t = (*e)[c];
        if (t.shape().rank() == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("Unbatch: component ", c, " is a scalar; Unbatch needs rank >= 1"));
        }
        if (rows_ >= 0 && t.shape().dim(0) != rows_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "Unbatch: components disagree on dimension 0 (", rows_, " vs ", t.shape().dim(0), ")"));
        }
        rows_ = t.shape().dim(0);
      }
      if (rows_ < 0) rows_ = 0;
      cur_ = std::move(*e);
      row_ = 0;
    }
    Element out;
    for (const Tensor& t : cur_) {
      SLUICE_ASSIGN_OR_RETURN(Tensor r, Row(t, row_));
      out.push_back(std::move(r));
    }
    ++row_;
    return Some(std::move(out));
  }

 private:
  Element cur_;
  int64_t row_ = 0, rows_ = 0;
};

class ShuffleIterator : public UnaryIterator {
 public:
  ShuffleIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, uint64_t salt)
      : UnaryIterator(std::move(a), std::move(in)) {
    const auto& s = node().shuffle();
    uint64_t seed = s.has_seed() ? s.seed() : std::random_device{}() ^
                                                  (uint64_t{std::random_device{}()} << 32);
    if (s.reshuffle_each_iteration()) seed = Mix(seed, salt);
    rng_.seed(seed);
  }
  Result Next() override {
    int64_t cap = node().shuffle().buffer_size();
    while (!in_done_ && static_cast<int64_t>(buf_.size()) < cap) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) {
        in_done_ = true;
        break;
      }
      buf_.push_back(std::move(*e));
    }
    if (buf_.empty()) return End();
    std::uniform_int_distribution<size_t> pick(0, buf_.size() - 1);
    size_t i = pick(rng_);
    std::swap(buf_[i], buf_.back());
    Element out = std::move(buf_.back());
    buf_.pop_back();
    return Some(std::move(out));
  }

 private:
  std::mt19937_64 rng_;
  std::vector<Element> buf_;
  bool in_done_ = false;
};

class RepeatIterator : public NodeIterator {
 public:
  RepeatIterator(AnalysisPtr a, const IteratorContext& ctx)
      : NodeIterator(std::move(a)), ctx_(ctx) {
    // Inputs are rebuilt every epoch, after the caller's placeholder element
    // may be gone: keep a copy.
    if (ctx.placeholder != nullptr) {
      placeholder_ = *ctx.placeholder;
      ctx_.placeholder = &*placeholder_;
    }
  }
  Result Next() override {
    int64_t count = node().repeat().count();
    while (count == -1 || epoch_ < count) {
      if (in_ == nullptr) {
        IteratorContext ctx = ctx_;
        ctx.salt = Mix(ctx_.salt, static_cast<uint64_t>(epoch_));
        SLUICE_ASSIGN_OR_RETURN(in_, MakeNodeIterator(a_->inputs[0], ctx));
        produced_this_epoch_ = false;
      }
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (e) {
        produced_this_epoch_ = true;
        return e;
      }
      in_.reset();
      ++epoch_;
      // An empty epoch stops the repetition (never spin) -- unless dynamic
      // sharding gave this epoch's splits to other workers.
      if (!produced_this_epoch_ &&
          (ctx_.splits == nullptr || !ctx_.splits->EpochHadSplits(epoch_ - 1))) {
        return End();
      }
    }
    return End();
  }

 private:
  std::optional<Element> placeholder_;
  IteratorContext ctx_;
  std::unique_ptr<Iterator> in_;
  int64_t epoch_ = 0;
  bool produced_this_epoch_ = false;
};

class TakeIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    int64_t c = node().take().count();
    if (c != -1 && taken_ >= c) return End();
    SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
    if (e) ++taken_;
    return e;
  }

 private:
  int64_t taken_ = 0;
};

class SkipIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    int64_t c = node().skip().count();
    while (c == -1 || skipped_ < c) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      ++skipped_;
    }
    return in_->Next();
  }

 private:
  int64_t skipped_ = 0;
};

class ShardIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  Result Next() override {
    const auto& s = node().shard();
    if (s.num_shards() == kShardHint) {
      return absl::FailedPreconditionError(
          "Shard(kShardHint, kShardHint) is a placeholder for Distribute's processing_mode "
          "\"hint\"; it cannot run locally or under another processing mode");
    }
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      int64_t i = pos_++;
      if (i % s.num_shards() == s.index()) return e;
    }
  }

 private:
  int64_t pos_ = 0;
};

// Runs the input on a background thread, at most buffer_size elements ahead.
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

// tf.data's deterministic interleave: cycle_length slots visited in turn,
// block_length elements from each; a slot whose dataset ends is emptied and
// refilled from the next input element when the cycle comes back to it.
class InterleaveIterator : public NodeIterator {
 public:
  InterleaveIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : NodeIterator(std::move(a)), in_(std::move(in)), ctx_(ctx),
        slots_(static_cast<size_t>(node().interleave().cycle_length())) {
    ctx_.splits = nullptr;  // per-element datasets read their own sources whole
  }
  Result Next() override {
    while (!in_done_ || open_ > 0) {
      std::unique_ptr<Iterator>& slot = slots_[cycle_];
      if (slot != nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto e, slot->Next());
        if (e) {
          if (++block_ >= node().interleave().block_length()) Advance();
          return e;
        }
        slot.reset();
        --open_;
        Advance();
      } else if (!in_done_) {
        SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
        if (!e) {
          in_done_ = true;
          continue;
        }
        IteratorContext ctx = ctx_;
        ctx.salt = Mix(ctx_.salt, opened_++);
        ctx.placeholder = &*e;
        SLUICE_ASSIGN_OR_RETURN(slot, MakeNodeIterator(a_->sub, ctx));
        ++open_;
      } else {
        Advance();
      }
    }
    return End();
  }

 private:
  void Advance() {
    block_ = 0;
    cycle_ = (cycle_ + 1) % slots_.size();
  }

  std::unique_ptr<Iterator> in_;
  IteratorContext ctx_;
  std::vector<std::unique_ptr<Iterator>> slots_;
  size_t cycle_ = 0;
  int64_t block_ = 0;
  int64_t open_ = 0;
  uint64_t opened_ = 0;
  bool in_done_ = false;
};

class EnumerateIterator : public UnaryIterator {
 public:
  EnumerateIterator(AnalysisPtr a, std::unique_ptr<Iterator> in)
      : UnaryIterator(std::move(a), std::move(in)), next_(node().enumerate().start()) {}
  Result Next() override {
    SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
    if (!e) return End();
    Element out;
    out.reserve(e->size() + 1);
    out.push_back(Tensor::Scalar<int64_t>(next_++));
    for (auto& t : *e) out.push_back(std::move(t));
    return Some(std::move(out));
  }

 private:
  int64_t next_;
};

class ZipIterator : public NodeIterator {
 public:
  ZipIterator(AnalysisPtr a, std::vector<std::unique_ptr<Iterator>> in)
      : NodeIterator(std::move(a)), in_(std::move(in)) {}
  Result Next() override {
    Element out;
    for (auto& it : in_) {
      SLUICE_ASSIGN_OR_RETURN(auto e, it->Next());
      if (!e) return End();
      for (auto& t : *e) out.push_back(std::move(t));
    }
    return Some(std::move(out));
  }

 private:
  std::vector<std::unique_ptr<Iterator>> in_;
};

// Makes the outcome after an error or the end repeat on later calls.
class StickyIterator : public Iterator {
 public:
  explicit StickyIterator(std::unique_ptr<Iterator> in) : in_(std::move(in)) {}
  Result Next() override {
    if (terminal_) return *terminal_;
    Result r = in_->Next();
    if (!r.ok() || !r->has_value()) {
      terminal_ = r;
      in_.reset();
    }
    return r;
  }

 private:
  std::unique_ptr<Iterator> in_;
  std::optional<Result> terminal_;
};

absl::StatusOr<std::unique_ptr<Iterator>> MakeUnsticky(AnalysisPtr a, const IteratorContext& ctx) {
  auto input = [&](size_t i) { return MakeNodeIterator(a->inputs[i], ctx); };
  const proto::DatasetNode& n = *a->node;
  switch (n.op_case()) {
    case proto::DatasetNode::kRange:
    case proto::DatasetNode::kFromTensors:
    case proto::DatasetNode::kListFiles:
      if (ctx.splits != nullptr) {
        return std::unique_ptr<Iterator>(new SplitReaderIterator(std::move(a), ctx.splits));
      }
      break;
    default:
      break;
  }
  switch (n.op_case()) {
    case proto::DatasetNode::kRange:
      return std::unique_ptr<Iterator>(new RangeIterator(std::move(a)));
    case proto::DatasetNode::kFromTensors:
      return std::unique_ptr<Iterator>(new FromTensorsIterator(std::move(a)));
    case proto::DatasetNode::kListFiles:
      return std::unique_ptr<Iterator>(new ListFilesIterator(std::move(a)));
    case proto::DatasetNode::kPlaceholder:
      if (ctx.placeholder == nullptr) {
        return absl::InvalidArgumentError("Placeholder is only valid inside Interleave");
      }
      return std::unique_ptr<Iterator>(new PlaceholderIterator(std::move(a), *ctx.placeholder));
    case proto::DatasetNode::kRepeat:
      return std::unique_ptr<Iterator>(new RepeatIterator(std::move(a), ctx));
    case proto::DatasetNode::kZip: {
      std::vector<std::unique_ptr<Iterator>> in;
      for (size_t i = 0; i < a->inputs.size(); ++i) {
        SLUICE_ASSIGN_OR_RETURN(auto it, input(i));
        in.push_back(std::move(it));
      }
      return std::unique_ptr<Iterator>(new ZipIterator(std::move(a), std::move(in)));
    }
    case proto::DatasetNode::kDataService: {
      DataServiceIteratorFactory factory = GetDataServiceIteratorFactory();
      if (factory == nullptr) {
        return absl::FailedPreconditionError(
            "this dataset reads from the sluice service; link the sluice client library "
            "(sluice::client or sluice::sluice)");
      }
      int64_t repetition = a->repetitions->fetch_add(1);
      return factory(n.data_service(), repetition);
    }
    case proto::DatasetNode::OP_NOT_SET:
      return absl::InvalidArgumentError("dataset definition has an empty node");
    default:
      break;
  }
  // Single-input ops.
  SLUICE_ASSIGN_OR_RETURN(auto in, input(0));
  switch (n.op_case()) {
    case proto::DatasetNode::kReadRecords:
      return std::unique_ptr<Iterator>(new ReadRecordsIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kReadFixedLengthRecords:
      return std::unique_ptr<Iterator>(new FixedLengthIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kMap:
      return std::unique_ptr<Iterator>(new MapIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kFilter:
      return std::unique_ptr<Iterator>(new FilterIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kBatch:
      return std::unique_ptr<Iterator>(new BatchIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kUnbatch:
      return std::unique_ptr<Iterator>(new UnbatchIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kShuffle:
      return std::unique_ptr<Iterator>(new ShuffleIterator(std::move(a), std::move(in), ctx.salt));
    case proto::DatasetNode::kTake:
      return std::unique_ptr<Iterator>(new TakeIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kSkip:
      return std::unique_ptr<Iterator>(new SkipIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kShard:
      return std::unique_ptr<Iterator>(new ShardIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kPrefetch:
      return std::unique_ptr<Iterator>(new PrefetchIterator(std::move(a), std::move(in)));
    case proto::DatasetNode::kInterleave:
      return std::unique_ptr<Iterator>(new InterleaveIterator(std::move(a), std::move(in), ctx));
    case proto::DatasetNode::kEnumerate:
      return std::unique_ptr<Iterator>(new EnumerateIterator(std::move(a), std::move(in)));
    default:
      return absl::InternalError("unhandled dataset op");
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Iterator>> MakeNodeIterator(AnalysisPtr analysis,
                                                           const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto it, MakeUnsticky(std::move(analysis), ctx));
  return std::unique_ptr<Iterator>(new StickyIterator(std::move(it)));
}

namespace {

// Collects the splittable sources under `n` (outside Interleave functions)
// and whether the path to each keeps elements tied to their source element.
absl::Status CollectSources(const proto::DatasetNode& n, bool tracked,
                            std::vector<SplitSourceInfo>* out) {
  using N = proto::DatasetNode;
  auto one = [&](const N& in, bool keeps) { return CollectSources(in, tracked && keeps, out); };
  switch (n.op_case()) {
    case N::kRange:
    case N::kFromTensors:
    case N::kListFiles:
      out->push_back({&n, tracked});
      return absl::OkStatus();
    case N::kReadRecords: return one(n.read_records().filenames(), true);
    case N::kReadFixedLengthRecords: return one(n.read_fixed_length_records().filenames(), true);
    case N::kMap: return one(n.map().input(), true);
    case N::kFilter: return one(n.filter().input(), true);
    case N::kTake: return one(n.take().input(), true);
    case N::kSkip: return one(n.skip().input(), true);
    case N::kShard: return one(n.shard().input(), true);
    case N::kUnbatch: return one(n.unbatch().input(), true);
    case N::kRepeat: return one(n.repeat().input(), true);
    case N::kBatch: return one(n.batch().input(), false);
    case N::kShuffle: return one(n.shuffle().input(), false);
    case N::kPrefetch: return one(n.prefetch().input(), false);
    case N::kEnumerate: return one(n.enumerate().input(), false);
    case N::kInterleave: return one(n.interleave().input(), false);
    case N::kZip:
      for (const N& in : n.zip().inputs()) SLUICE_RETURN_IF_ERROR(one(in, false));
      return absl::OkStatus();
    case N::kPlaceholder:
    case N::kDataService:
    case N::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "distributed_epoch: the pipeline has a node that cannot be split (a Placeholder outside "
      "Interleave, a nested Distribute or an empty node)");
}

}  // namespace

absl::StatusOr<SplitSourceInfo> FindSplitSource(const proto::DatasetNode& root) {
  std::vector<SplitSourceInfo> sources;
  SLUICE_RETURN_IF_ERROR(CollectSources(root, true, &sources));
  if (sources.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed_epoch needs a pipeline with exactly one Range, FromTensors or ListFiles "
        "source (outside Interleave functions) to split; this one has ",
        sources.size(), "; use parallel_epochs, or Zip/Interleave after Distribute"));
  }
  return sources[0];
}

}  // namespace sluice::internal
