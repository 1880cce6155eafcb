// Internals shared by the builder (dataset.cc) and the local executor
// (executor.cc).
//
// Every dataset node is analyzed once, bottom-up: its arguments are
// validated, its element spec and cardinality inferred and its functions
// compiled. The builder analyzes each new node against its inputs'
// analyses; FromDef analyzes a whole definition. Iterators are built from
// the analysis tree and keep it alive.
#pragma once

#include <atomic>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dataset/dataset.pb.h"
#include "sluice/core/index_set.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr_internal.h"

namespace sluice::internal {

// Reads a DataService node's elements from the service: the client library
// (client/distribute.cc) implements it and attaches one to each node it
// builds (MakeDataServiceDataset), holding what only the client knows (the
// service's TLS files and token, data plane, placement, timeouts). The
// definition carries none of it, so a DataService node rebuilt from a
// definition (FromDef) has no reader and cannot be iterated.
// Thread-safe: iterators of one dataset may be created on several threads.
class ServiceReader {
 public:
  virtual ~ServiceReader() = default;
  // An iterator over iteration `repetition` (0, 1, ...) of the job that
  // `node` describes; `node` is the one the reader was attached to.
  // `resume`, when set, is the service checkpoint (proto::ServiceCheckpoint,
  // serialized) the iteration resumes from.
  virtual absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(
      const proto::DatasetNode::DataService& node, int64_t repetition,
      const std::string* resume) const = 0;
};

// A pipeline restored from a checkpoint that holds a service iterator's
// position (Iterator::Save of a Distribute): the first service iterator
// made takes it and resumes its iteration there; later ones (the next
// repetitions) start fresh.
inline constexpr char kDataServiceOpName[] = "Distribute";  // the op's name in checkpoints
struct ServiceResume {
  std::string checkpoint;
  std::atomic<bool> taken{false};
};

struct Analysis {
  std::shared_ptr<const void> keep_alive;  // owns the proto `node` points into
  const proto::DatasetNode* node = nullptr;
  ElementSpec spec;
  int64_t cardinality = kUnknownCardinality;
  std::vector<std::shared_ptr<const Analysis>> inputs;
  std::shared_ptr<const CompiledFunction> fn;  // Map, Filter
  // How many functions (Map, Filter) run before this node's, on the way
  // from the source: its random calls mix it into their seeds, so that two
  // Maps of the same function draw differently.
  int64_t functions_below = 0;
  std::shared_ptr<const Analysis> sub;         // Interleave's per-element dataset
  std::vector<Element> elements;               // FromTensors, decoded once
  // DataService: counts the iterators created, so each is the next
  // repetition (iteration) of the job.
  std::shared_ptr<std::atomic<int64_t>> repetitions;
  // DataService: what reads it (null when built from a definition).
  std::shared_ptr<const ServiceReader> reader;
};

// A dataset whose status() is `s` (for builders in other modules).
Dataset MakeErrorDataset(absl::Status s);

// Wraps a DataService node into a Dataset whose iterators `reader` makes
// (used by the client). `input`: the pipeline the node's definition holds
// (null for a dataset_id); its seed carries on.
Dataset MakeDataServiceDataset(proto::DatasetNode node, const Dataset* input,
                               std::shared_ptr<const ServiceReader> reader);

// Analyzes `node` whose inputs (in proto field order; Interleave: the input
// only) have been analyzed. `placeholder` is the spec a Placeholder source
// stands for (null outside an Interleave function).
absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeNode(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    std::vector<std::shared_ptr<const Analysis>> inputs, std::shared_ptr<const Analysis> sub,
    const ElementSpec* placeholder);

// Analyzes a whole tree.
absl::StatusOr<std::shared_ptr<const Analysis>> AnalyzeTree(
    std::shared_ptr<const void> keep_alive, const proto::DatasetNode& node,
    const ElementSpec* placeholder);

// Dynamic sharding (distributed_epoch): a part of the pipeline's only
// source, handed out by the dispatcher.
struct Split {
  int64_t id = 0;
  int64_t begin = 0, end = 0;  // source positions [begin, end)
  int64_t epoch = 0;
  // ListFiles: the split's files, one per position from begin on.
  std::vector<std::string> files;
  // A split resumed from a service checkpoint: the indices of its output
  // already delivered (produced again, not sent).
  IndexSet skip;
};

// Where a pipeline's split source (the one Range, FromTensors or ListFiles
// of a distributed_epoch pipeline) gets its splits. Implemented by the
// worker (a prefetching client of the dispatcher's GetSplit). Next and
// BeginEpoch are called from the thread that reads the source (the
// pipeline's, or a read-ahead op's); ReadAhead and Released from any:
// implementations lock.
class SplitSource {
 public:
  virtual ~SplitSource() = default;
  // A source iterator starts: returns its epoch (0, 1, ... for each
  // repetition of the source by an enclosing Repeat).
  virtual int64_t BeginEpoch() = 0;
  // The next split of `epoch`, nullopt once every split of it completed.
  // Calling it means the previous split of this source is read to the end.
  virtual absl::StatusOr<std::optional<Split>> Next(int64_t epoch) = 0;
  // After Next(epoch) returned nullopt: whether the epoch had splits at all
  // (on any worker). Repeat ends on an epoch empty everywhere, not on one
  // that other workers processed.
  virtual bool EpochHadSplits(int64_t epoch) = 0;

  // A read-ahead op (SplitPassing::kReadsAhead: Prefetch, a deterministic
  // parallel Map) holds elements of splits its source may have left: a
  // split read to the end is not done while one holds an element of it.
  // The op took an element of `split` (its input's ElementSplit(); -1:
  // none) from its input ...
  virtual void ReadAhead(int64_t split) {}
  // ... and the element left it: the op was asked for its next element
  // after returning it (it went on up the pipeline, which produced it or
  // dropped it, or into the next read-ahead op), or the op dropped it.
  virtual void Released(int64_t split) {}
};

struct IteratorContext {
  uint64_t salt = 0;                    // varies shuffles per iteration and epoch
  uint64_t seed = 0;                    // the pipeline's (ContextSeed): random functions' seeds
  const Element* placeholder = nullptr;  // the element a Placeholder yields
  std::optional<uint64_t> placeholder_key;  // and its key (Interleave's input element's)
  // Non-null: the pipeline's source reads splits from here (not inherited
  // by Interleave's per-element datasets).
  SplitSource* splits = nullptr;
  std::shared_ptr<ServiceResume> service_resume;
};

// The source that dynamic sharding splits, found in a definition.
struct SplitSourceInfo {
  const proto::DatasetNode* source = nullptr;  // Range, FromTensors or ListFiles
  // Every op between the source and the root keeps output elements tied to
  // the source element they came from, in order (Map but a parallel one,
  // Filter, Take, Skip, Shard, Unbatch, Repeat, ReadRecords,
  // ReadFixedLengthRecords, Prefetch, a deterministic parallel Map): output
  // elements can be tagged with (split, index in split), the split being
  // the root iterator's ElementSplit().
  bool tracked = true;
  // Tracked through read-ahead ops (SplitPassing::kReadsAhead).
  bool reads_ahead = false;
  // The first op on the path from the root that keeps a service
  // checkpoint from resuming (an untracked op, or one that counts across
  // splits: OpDef::counts_across_splits); null when none does.
  const char* unresumable_op = nullptr;
};
// InvalidArgument (naming the op) unless the pipeline has exactly one
// splittable source outside Interleave functions.
absl::StatusOr<SplitSourceInfo> FindSplitSource(const proto::DatasetNode& root);

// The positions one epoch of a split source has: what the dispatcher cuts
// into splits (its split provider).
struct SplitPositions {
  int64_t positions = 0;
  // Whether a split may cover several positions (a Range: the dispatcher's
  // range_split_elements applies); otherwise every split is one position.
  bool multi_position_splits = false;
  std::vector<std::string> files;  // ListFiles: the file at each position, sorted
};
// The positions of `source` (SplitSourceInfo::source), from its op's
// split-source traits (dataset/ops/). Internal when it is not a split
// source; ListFiles' NotFound/Unavailable when its pattern matches nothing
// or cannot be read.
absl::StatusOr<SplitPositions> SplitSourcePositions(const proto::DatasetNode& source);

// The files matching a glob pattern, sorted (what ListFiles yields); with
// `recursive`, a matching directory stands for the files under it at any
// depth: NotFound when none match, Unavailable when the pattern or a
// directory cannot be read.
absl::StatusOr<std::vector<std::string>> GlobFiles(const std::string& pattern,
                                                   bool recursive = false);

// Static sharding (tf.data's FILE, DATA, FILE_OR_DATA and HINT policies):
// worker `index` of `num_shards` reads one shard of the pipeline.
enum class StaticSharding : uint8_t {
  kFile,        // every file source reads every num_shards-th file
  kData,        // the pipeline's output keeps every num_shards-th element
  kFileOrData,  // kFile when the pipeline has a file source, else kData
  kHint,        // every Shard(kShardHint, kShardHint) becomes Shard(num_shards, index)
};

// Rewrites `def` to read shard `index` of `num_shards`. File sources are
// ListFiles nodes, the file names read by ReadRecords /
// ReadFixedLengthRecords, and the input of an Interleave whose function
// reads records from its element. Errors (InvalidArgument): kFile without
// a file source; kHint without a hint; a file source known to hold fewer
// files than shards (ListFiles is globbed here; its NotFound/Unavailable
// errors are returned as they are).
absl::StatusOr<proto::DatasetDef> ApplyStaticSharding(const proto::DatasetDef& def,
                                                      StaticSharding policy, int64_t num_shards,
                                                      int64_t index);
// Whether `root` has a Shard(kShardHint, kShardHint) outside or inside
// Interleave functions.
bool ContainsShardHint(const proto::DatasetNode& root);

// Checkpoints (dataset/checkpoint.cc): the version of the format
// Iterator::Save writes; the iterator Dataset::MakeIterator returns (its
// Save() frames the pipeline's state), made fresh or restored from a
// checkpoint of the pipeline with this fingerprint.
// 2: element keys kept through more ops: file readers save their open
// file's key and index, Unbatch its element's key, Interleave its slots'.
inline constexpr uint32_t kCheckpointFormatVersion = 2;
absl::StatusOr<std::unique_ptr<Iterator>> MakeRootIterator(
    std::shared_ptr<const Analysis> analysis, const IteratorContext& ctx, uint64_t fingerprint);
absl::StatusOr<std::unique_ptr<Iterator>> RestoreRootIterator(
    std::shared_ptr<const Analysis> analysis, IteratorContext ctx, uint64_t fingerprint,
    const std::string& checkpoint);

absl::StatusOr<std::unique_ptr<Iterator>> MakeNodeIterator(
    std::shared_ptr<const Analysis> analysis, const IteratorContext& ctx);

// Mixes two 64-bit values (seeds and salts of shuffles per epoch/element, random functions' seeds).
inline uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// The key (Iterator::ElementKey) of the element at `position` of a source
// in `epoch`, and a key carried into a later epoch by Repeat: a local
// source under Repeat and a split source in that epoch give the same.
inline uint64_t EpochKey(uint64_t key, int64_t epoch) {
  return epoch == 0 ? key : Mix(key, static_cast<uint64_t>(epoch));
}
inline uint64_t SourceKey(int64_t epoch, int64_t position) {
  return EpochKey(Mix(0x5eed5eed5eed5eedull, static_cast<uint64_t>(position)), epoch);
}

// The seed of an iterator of `def`: its seed (Dataset::WithSeed), else a
// random one.
uint64_t ContextSeed(const proto::DatasetDef& def);

// Stable 64-bit FNV-1a.
uint64_t Fnv1a64(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);

// The canonical (deterministic) serialization of a definition, and its
// fingerprint: what Dataset::Fingerprint() and the dispatcher's dataset
// deduplication use.
std::string CanonicalBytes(const proto::DatasetDef& def);
uint64_t DefFingerprint(const proto::DatasetDef& def);
// What a checkpoint is checked against (Iterator::Save): the pipeline's
// fingerprint without where its service runs (Distribute's address and job
// name), so that a service iterator resumes on another dispatcher or in a
// new job.
uint64_t CheckpointFingerprint(const proto::DatasetDef& def);

}  // namespace sluice::internal

namespace sluice {

struct Dataset::Rep {
  std::shared_ptr<const proto::DatasetDef> def;
  absl::Status status;
  std::shared_ptr<const internal::Analysis> analysis;  // null when !status.ok()
  mutable std::atomic<uint64_t> iterations{0};
  // CheckpointFingerprint(*def), computed once.
  mutable std::once_flag checkpoint_fingerprint_once;
  mutable uint64_t checkpoint_fingerprint = 0;
};

}  // namespace sluice
