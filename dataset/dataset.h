// The dataset builder API and local execution.
//
//   using sluice::expr::x;
//   auto ds = sluice::Dataset::Range(5).Map(x * x).Map(x + 1);
//   auto it = ds.MakeIterator();
//   while (true) {
//     auto e = (*it)->Next();          // StatusOr<optional<Element>>
//     if (!e.ok() || !e->has_value()) break;
//   }
//
// A Dataset is an immutable value: a serializable definition (DatasetDef
// proto) plus what could be inferred from it when it was built (element
// spec, cardinality). Building never throws: an invalid step (unknown UDF,
// wrong arity, dtype mismatch, bad argument) yields a Dataset whose status()
// holds InvalidArgument naming the op; every later step keeps that first
// error and MakeIterator() returns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/core/tensor.h"
#include "sluice/dataset/element_spec.h"
#include "sluice/dataset/expr.h"

namespace sluice {
namespace proto {
class DatasetDef;
class DatasetNode;
class IteratorState;
}  // namespace proto

// Pulls elements. Not thread-safe: one thread calls Next() at a time.
class Iterator {
 public:
  virtual ~Iterator() = default;
  // The next element, std::nullopt at end of input, or an error. After an
  // error or the end, further calls keep returning the same outcome.
  virtual absl::StatusOr<std::optional<Element>> Next() = 0;
  // Where the element the last Next() returned came from: a key derived
  // from its position in the pipeline's source and its epoch, when every
  // op on the way keeps that tie (docs/datasets.md, "Randomness"); random
  // functions seed from it. nullopt when not kept.
  virtual std::optional<uint64_t> ElementKey() const { return std::nullopt; }
  // Internal (distributed_epoch on a worker): the split (SplitSource) the
  // element the last Next() returned came from; -1 when not known.
  virtual int64_t ElementSplit() const { return -1; }

  // Checkpoints (docs/datasets.md, "Checkpoints"): this iterator's position
  // after the last Next(), as bytes. Dataset::MakeIterator(checkpoint) of
  // the same pipeline resumes there: it returns what this iterator would
  // have returned next. Unimplemented, naming the op, when the pipeline has
  // an op that cannot save its position.
  virtual absl::StatusOr<std::string> Save() const;
  // Internal (the ops): this iterator's part of a checkpoint, and restoring
  // an iterator just made to it.
  virtual absl::Status SaveState(proto::IteratorState* state) const;
  virtual absl::Status RestoreState(const proto::IteratorState& state);
};

// num_parallel_calls or Prefetch's buffer_size chosen by sluice, as
// tf.data's AUTOTUNE (docs/datasets.md, "Parallelism").
inline constexpr int64_t kAutotune = -1;

inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;

// Shard(kShardHint, kShardHint): a placeholder filled in by static sharding
// (processing_mode "hint"), as tf.data's SHARD_HINT.
inline constexpr int64_t kShardHint = -1;

class Dataset {
 public:
  // ---- sources ----
  static Dataset Range(int64_t stop);
  static Dataset Range(int64_t start, int64_t stop, int64_t step = 1);
  // Each element must have the same number of components with the same
  // dtypes; shapes may differ (the spec records unknown dims).
  static Dataset FromTensors(std::vector<Element> elements);
  // Files matching a glob pattern, sorted, as string scalars. A pattern
  // matching nothing is NotFound when iterated. `recursive`: a matching
  // directory stands for the files under it at any depth (directory
  // symlinks are not followed).
  static Dataset ListFiles(std::string pattern, bool recursive = false);
  // TFRecord files (length, masked CRC32C of length, data, masked CRC32C of
  // data); each record is a string scalar. CRC mismatch -> DataLoss.
  static Dataset ReadRecords(std::vector<std::string> files);
  // `filenames` yields string scalars or vectors of paths.
  static Dataset ReadRecords(const Dataset& filenames);
  // Fixed-size records after `header_bytes` and before `footer_bytes`.
  static Dataset ReadFixedLengthRecords(std::vector<std::string> files, int64_t record_bytes,
                                        int64_t header_bytes = 0, int64_t footer_bytes = 0);
  static Dataset ReadFixedLengthRecords(const Dataset& filenames, int64_t record_bytes,
                                        int64_t header_bytes = 0, int64_t footer_bytes = 0);
  // WebDataset tar shards (dataset/webdataset.h): one element per sample,
  // the requested `fields` as string scalars in the order asked. A field is
  // an extension ("jpg", "cls"), alternatives taken in order ("jpg;png"),
  // or "__key__" (the sample's key). A sample without a requested field is
  // InvalidArgument naming the shard and the sample's key, unless
  // skip_incomplete passes over it; a truncated or corrupt shard is
  // DataLoss naming it and the byte offset. `pattern` is a glob (as
  // ListFiles: shards split and shard as its files do).
  static Dataset WebDataset(std::string pattern, std::vector<std::string> fields,
                            bool skip_incomplete = false);
  static Dataset WebDataset(std::vector<std::string> shards, std::vector<std::string> fields,
                            bool skip_incomplete = false);
  // `shards` yields string scalars or vectors of paths.
  static Dataset WebDataset(const Dataset& shards, std::vector<std::string> fields,
                            bool skip_incomplete = false);
  // Tuples of the inputs' elements; ends with the shortest input.
  static Dataset Zip(std::vector<Dataset> inputs);

  // Rebuilds and validates a dataset from its definition (what workers do).
  static absl::StatusOr<Dataset> FromDef(const proto::DatasetDef& def);
  static absl::StatusOr<Dataset> Deserialize(const std::string& bytes);

  // ---- transforms ----
  Dataset Map(const Function& fn) const;
  // Up to num_parallel_calls calls of `fn` at once on the process-wide
  // thread pool (kAutotune: sized from the pool and the measured cost of a
  // call). deterministic keeps the input's order; false yields results as
  // they complete. Either way an error ends the iterator at the element
  // that failed (in its position when deterministic), and nothing after
  // it is delivered. `fn` may run on several threads at once.
  Dataset Map(const Function& fn, int64_t num_parallel_calls, bool deterministic = true) const;
  // `predicate` must yield one bool scalar.
  Dataset Filter(const Function& predicate) const;
  // Stacks `batch_size` elements along a new leading dimension; component
  // shapes within a batch must match. num_parallel_calls > 1 (or
  // kAutotune) copies large batches into place on several pool threads.
  Dataset Batch(int64_t batch_size, bool drop_remainder = false,
                int64_t num_parallel_calls = 1) const;
  // Splits each component along dimension 0 (all components must agree).
  Dataset Unbatch() const;
  // Uniform shuffle through a buffer. Without a seed the order is random;
  // with one it is reproducible. reshuffle_each_iteration: each new
  // iterator, and each epoch under Repeat, uses a different order.
  Dataset Shuffle(int64_t buffer_size, std::optional<uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const;
  // `count` passes over the input, each a new iterator (tf.data's repeat):
  // a finite count runs every pass, even empty ones; count = -1 repeats
  // forever, ending at a pass that yields nothing -- unless the input reads
  // from the service (Distribute, FromDatasetId), whose passes are the
  // job's successive iterations: an empty one is passed over.
  Dataset Repeat(int64_t count = -1) const;
  Dataset Take(int64_t count) const;
  Dataset Skip(int64_t count) const;
  // Every num_shards-th element starting at index. Shard(kShardHint,
  // kShardHint) marks where Distribute's processing_mode "hint" shards the
  // pipeline (worker i of N reads shard i); it cannot run anywhere else.
  Dataset Shard(int64_t num_shards, int64_t index) const;
  // Produces up to buffer_size elements ahead on a background thread
  // (kAutotune: as many as the pool has threads, at least 2, and at most
  // 64 MiB of them beyond the first).
  Dataset Prefetch(int64_t buffer_size) const;
  // Applies `fn` to a one-element dataset per input element (for example a
  // file name) and interleaves up to cycle_length of the resulting datasets,
  // block_length elements at a time, deterministically. num_parallel_calls
  // > 1 (or kAutotune) reads up to that many of the open datasets ahead at
  // once on the pool, block_length elements each; the order is the same.
  Dataset Interleave(const std::function<Dataset(const Dataset&)>& fn, int64_t cycle_length,
                     int64_t block_length = 1, int64_t num_parallel_calls = 1) const;
  // Prepends an int64 scalar counter component.
  Dataset Enumerate(int64_t start = 0) const;
  // The pipeline's seed: random functions (image.h) of every Map in it,
  // before and after this call, draw from it, the element's position in
  // its source and the function's place in the pipeline, so the same seed
  // gives the same elements whatever the number of workers or threads
  // (docs/datasets.md, "Randomness"). Without a seed every iterator draws
  // a random one. Carried through later steps and Distribute.
  Dataset WithSeed(uint64_t seed) const;
  // transformation(*this), so that a step defined elsewhere chains like the
  // ones above (tf.data's apply), such as the client library's
  // sluice::Distribute (client/distribute.h):
  //   Dataset::Range(5).Map(x * x).Apply(sluice::Distribute(options)).Map(x + 1)
  // A dataset whose status() is an error is returned as it is, without
  // calling `transformation`.
  Dataset Apply(const std::function<Dataset(const Dataset&)>& transformation) const;

  // ---- inspection ----
  const absl::Status& status() const;
  const ElementSpec& element_spec() const;
  // Number of elements, kInfiniteCardinality or kUnknownCardinality.
  int64_t Cardinality() const;
  // Stable 64-bit hash of the canonical (deterministic) serialization.
  uint64_t Fingerprint() const;
  // What checkpoints of its iterators are checked against: Fingerprint()
  // without where a Distribute's service runs (address, job name).
  uint64_t CheckpointFingerprint() const;
  const proto::DatasetDef& def() const;
  absl::StatusOr<std::string> Serialize() const;
  std::string DebugString() const;

  // Each call starts a fresh pass over the data.
  absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator() const;
  // Resumes where the iterator that saved `checkpoint` (Iterator::Save) was.
  // InvalidArgument when the checkpoint is of another pipeline, of another
  // format version, truncated or corrupt.
  absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(const std::string& checkpoint) const;

  // Internal: used by the builder and higher modules.
  struct Rep;
  explicit Dataset(std::shared_ptr<Rep> rep) : rep_(std::move(rep)) {}
  const std::shared_ptr<Rep>& rep() const { return rep_; }

 private:
  std::shared_ptr<Rep> rep_;
};

}  // namespace sluice
