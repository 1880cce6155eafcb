// The dataset op registry (internal).
//
// Everything sluice knows about one op lives in that op's file,
// dataset/ops/<op>.cc, as one OpDef: its inputs, validation and analysis
// (element spec, cardinality), its iterator, what static and dynamic
// sharding do with it and, for a source that dynamic sharding can split,
// its split-source traits. ops/registry.cc lists the ops, one line each,
// keyed by the DatasetNode oneof case. The builder (dataset.cc), the
// executor (executor.cc), static sharding (sharding.cc) and, through
// SplitSourcePositions (dataset_internal.h), the dispatcher consult it.
//
// Adding an op: its message in DatasetNode's oneof (dataset.proto), the
// file dataset/ops/<op>.cc that defines `extern const OpDef k<Name>Op`, one
// line in ops/registry.cc, the file in dataset/CMakeLists.txt, and a
// builder method (dataset.h/.cc). docs/datasets.md has an example.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/thread_pool.h"

namespace sluice::internal {

// ---- the traits one op file defines --------------------------------------

// A source that distributed_epoch splits (Range, FromTensors, ListFiles):
// the dispatcher cuts its positions into splits, and workers read them.
struct SplitSourceTraits {
  // The positions of one epoch of the source (ListFiles lists its files
  // now: its NotFound/Unavailable errors are returned as they are).
  absl::StatusOr<SplitPositions> (*positions)(const proto::DatasetNode& node) = nullptr;
  // The element at source position `pos` of `split` (begin <= pos < end).
  absl::StatusOr<Element> (*element_at)(const Analysis& a, const Split& split,
                                        int64_t pos) = nullptr;
};

// How an op lets distributed_epoch's splits through (FindSplitSource).
enum class SplitPassing : uint8_t {
  kNone,       // the pipeline cannot be split through it (Placeholder, Distribute)
  kTracked,    // output elements stay tied to the source element they came
               // from, in order: they can be tagged with (split, index)
  kUntracked,  // splits pass, the tie to source elements does not (Batch, Zip)
  kReadsAhead,  // as kTracked, but the op reads its input ahead of its output on
                // a thread of its own (Prefetch, a deterministic parallel Map): it
                // keeps each element's ElementSplit() and tells the split source
                // which splits it holds (SplitSource::ReadAhead, Released)
};

// What static FILE sharding (ApplyStaticSharding) does with an op.
enum class FileSharding : uint8_t {
  kNone,        // nothing: it looks further down the inputs
  kListsFiles,  // yields file names itself (ListFiles): wrapped in a Shard
  kReadsFiles,  // reads the files its first input names (ReadRecords,
                // ReadFixedLengthRecords): that input is wrapped in a Shard,
                // or the ListFiles under it is
  kReadsFilesInFunction,  // as kReadsFiles when its per-element function
                          // contains a kReadsFiles op (Interleave)
};

struct OpDef {
  const char* name = nullptr;  // as errors name the op: "Range", "Distribute"

  // ---- structure ----
  // The input datasets in proto field order, not the function; null for a
  // source.
  std::vector<const proto::DatasetNode*> (*inputs)(const proto::DatasetNode& node) = nullptr;
  std::vector<proto::DatasetNode*> (*mutable_inputs)(proto::DatasetNode* node) = nullptr;
  // The dataset the op builds per input element over a Placeholder
  // (Interleave's function): analyzed into Analysis::sub with the input's
  // element spec as the placeholder's.
  const proto::DatasetNode* (*function)(const proto::DatasetNode& node) = nullptr;
  proto::DatasetNode* (*mutable_function)(proto::DatasetNode* node) = nullptr;

  // ---- analysis ----
  // Validates `a.node` against its analyzed inputs (`a.inputs`, `a.sub`
  // set) and fills in the rest of `a`: spec, cardinality and whatever its
  // iterator needs. `placeholder` is the spec a Placeholder stands for
  // (null outside an Interleave function). Errors are InvalidArgument
  // naming the op.
  absl::Status (*analyze)(Analysis& a, const ElementSpec* placeholder) = nullptr;

  // ---- execution ----
  // A fresh iterator; the caller makes its end and errors sticky.
  absl::StatusOr<std::unique_ptr<Iterator>> (*make_iterator)(
      std::shared_ptr<const Analysis> a, const IteratorContext& ctx) = nullptr;
  // Each iterator reads the next iteration of a service job, so one pass
  // that yields nothing says nothing of the next (Repeat goes on).
  bool reads_service_iterations = false;

  // ---- dynamic sharding (distributed_epoch) ----
  const SplitSourceTraits* split_source = nullptr;  // non-null: a split source
  SplitPassing split_passing = SplitPassing::kNone;
  // When set, decides per node instead (Map: a parallel one reads ahead
  // across splits).
  SplitPassing (*split_passing_of)(const proto::DatasetNode& node) = nullptr;
  // A tracked op whose output from a split depends on what the task read
  // before it (a count kept across splits: Take, Skip, Shard): a split
  // produced again on another worker differs, so a service checkpoint
  // cannot resume through it (FindSplitSource's unresumable_op).
  bool counts_across_splits = false;

  // ---- static sharding ----
  FileSharding file_sharding = FileSharding::kNone;
  // How many elements (file names) the op yields, when known without
  // running it (ListFiles globs, FromTensors counts): FILE sharding refuses
  // fewer files than workers. Null: not known.
  absl::StatusOr<int64_t> (*known_files)(const proto::DatasetNode& node) = nullptr;
  // Shard: whether `node` is Shard(kShardHint, kShardHint), and filling it in.
  bool (*is_shard_hint)(const proto::DatasetNode& node) = nullptr;
  void (*fill_shard_hint)(proto::DatasetNode* node, int64_t num_shards, int64_t index) = nullptr;
};

// ---- the registry (ops/registry.cc) ---------------------------------------

// The op of a oneof case; null for OP_NOT_SET.
const OpDef* FindOp(proto::DatasetNode::OpCase op_case);

// `node`'s input datasets (OpDef::inputs); none for a source or an empty node.
std::vector<const proto::DatasetNode*> InputsOf(const proto::DatasetNode& node);
std::vector<proto::DatasetNode*> MutableInputsOf(proto::DatasetNode* node);

// OpDef::inputs / mutable_inputs of an op whose one input is the field
// `input` of its message, given the message's accessor:
//   .inputs = &InputField<&proto::DatasetNode::map>,
//   .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_map>,
template <auto kMessage>
std::vector<const proto::DatasetNode*> InputField(const proto::DatasetNode& node) {
  return {&(node.*kMessage)().input()};
}
template <auto kMutableMessage>
std::vector<proto::DatasetNode*> MutableInputField(proto::DatasetNode* node) {
  return {(node->*kMutableMessage)()->mutable_input()};
}

// ---- helpers for analysis -------------------------------------------------

// InvalidArgument "<op>: <msg>".
absl::Status Invalid(absl::string_view op, absl::string_view msg);

// InvalidArgument naming `op` unless num_parallel_calls is kAutotune or in
// [0, kMaxParallelCalls] (0, unset in a definition, means 1).
absl::Status CheckParallelCalls(absl::string_view op, int64_t num_parallel_calls);

// The first input's analysis; InvalidArgument naming `op` when there is none.
absl::StatusOr<const Analysis*> FirstInput(const Analysis& a, absl::string_view op);

inline ComponentSpec ScalarSpec(DType d) { return ComponentSpec{d, std::vector<int64_t>{}}; }

// ---- helpers for iterators ------------------------------------------------

using Result = absl::StatusOr<std::optional<Element>>;
using AnalysisPtr = std::shared_ptr<const Analysis>;

inline Result End() { return std::optional<Element>(); }
inline Result Some(Element e) { return std::optional<Element>(std::move(e)); }

// Holds the analysis (and so the definition) alive for the iterator's life.
//
// Checkpoints (dataset/checkpoint.cc): an op that can save its position
// overrides SaveState (BeginSave, then its counters, elements and inputs'
// states) and RestoreState (CheckState first: an iterator just made is
// brought to the saved position); the others answer Unimplemented naming
// the op.
class NodeIterator : public Iterator {
 public:
  explicit NodeIterator(AnalysisPtr a) : a_(std::move(a)) {}
  absl::Status SaveState(proto::IteratorState* state) const override;
  absl::Status RestoreState(const proto::IteratorState& state) override;

 protected:
  const proto::DatasetNode& node() const { return *a_->node; }
  // Names this op in `state`.
  absl::Status BeginSave(proto::IteratorState* state) const;
  // InvalidArgument unless `state` is this op's, with `values` counters and
  // `inputs` inputs' states.
  absl::Status CheckState(const proto::IteratorState& state, int values, int inputs) const;
  // The common shape: this op's name and counters; restored (after
  // CheckState with `inputs` inputs) into the variables pointed to.
  absl::Status SaveValues(proto::IteratorState* state,
                          std::initializer_list<int64_t> values) const;
  absl::Status RestoreValues(const proto::IteratorState& state,
                             std::initializer_list<int64_t*> values, int inputs = 0) const;
  AnalysisPtr a_;
};

// An op with one input iterator. Its output element comes from the input
// element last read (so from its split): true of every tracked op
// (SplitPassing::kTracked); read-ahead ones override ElementSplit.
class UnaryIterator : public NodeIterator {
 public:
  UnaryIterator(AnalysisPtr a, std::unique_ptr<Iterator> in)
      : NodeIterator(std::move(a)), in_(std::move(in)) {}
  int64_t ElementSplit() const override { return in_->ElementSplit(); }

 protected:
  // SaveValues / RestoreValues, then the input's state.
  absl::Status SaveWithInput(proto::IteratorState* state,
                             std::initializer_list<int64_t> values) const {
    SLUICE_RETURN_IF_ERROR(SaveValues(state, values));
    return in_->SaveState(state->add_inputs());
  }
  absl::Status RestoreWithInput(const proto::IteratorState& state,
                                std::initializer_list<int64_t*> values) {
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, values, 1));
    return in_->RestoreState(state.inputs(0));
  }
  std::unique_ptr<Iterator> in_;
};

// The state of an input that reached its end (or an error an op holds
// ahead): restoring it gives an iterator at its end.
inline constexpr char kEndedState[] = "<ended>";

// Checkpoint helpers: the op's name; InvalidArgument for a checkpoint that
// does not fit; an element saved into / restored from state.elements.
std::string OpNameOf(const proto::DatasetNode& node);
absl::Status CorruptCheckpoint(absl::string_view why);
absl::Status SaveElement(const Element& e, proto::IteratorState* state);
absl::StatusOr<Element> RestoreElement(const proto::IteratorState& state, int i);
// Results an op holds ahead of its consumer (Prefetch's buffer, a parallel
// Map's calls): elements with their keys, perhaps ending in the input's end
// or an error (nothing after such a terminal result is saved). SaveHeld
// appends them (3 + 2 per element values, the elements, the error's
// message in blob); RestoreHeld reads them back from values[first] on.
struct HeldResult {
  Result result;
  std::optional<uint64_t> key;
};
absl::Status SaveHeld(const std::vector<const HeldResult*>& held, proto::IteratorState* state);
absl::StatusOr<std::vector<HeldResult>> RestoreHeld(const proto::IteratorState& state, int first);

// An op whose output elements are input elements (or made from one each,
// in order): an element's key is its input's.
class ForwardingIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  std::optional<uint64_t> ElementKey() const override { return in_->ElementKey(); }
};

// The key of an element made of several (Batch, Zip): `acc` (a seed, then
// what this returned) mixed with each part's key in order; nullopt once a
// part has none.
inline std::optional<uint64_t> CombineKeys(std::optional<uint64_t> acc,
                                           std::optional<uint64_t> part) {
  if (!acc || !part) return std::nullopt;
  return Mix(*acc, *part);
}

// Seeds the random calls of an op's function (CompiledFunction::Apply) per
// element: from the pipeline's seed and the element's key or, where the
// input does not keep keys, the element's position in this iterator's
// input (then the seeds depend on how the input was divided up).
class ElementSeeder {
 public:
  ElementSeeder(const IteratorContext& ctx, const Analysis& a)
      : seed_(Mix(ctx.seed, static_cast<uint64_t>(a.functions_below))) {}
  uint64_t SeedFor(std::optional<uint64_t> key) {
    return Mix(seed_, key ? *key : Mix(0x0c0ffee0c0ffee00ull, static_cast<uint64_t>(untracked_++)));
  }
  // Its position, for checkpoints.
  int64_t untracked() const { return untracked_; }
  int64_t* untracked_position() { return &untracked_; }

 private:
  const uint64_t seed_;
  int64_t untracked_ = 0;
};

// OpDef::make_iterator of an op whose iterator is It(analysis, input
// iterator) or It(analysis, input iterator, context).
template <typename It>
absl::StatusOr<std::unique_ptr<Iterator>> MakeUnaryIterator(AnalysisPtr a,
                                                            const IteratorContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(auto in, MakeNodeIterator(a->inputs[0], ctx));
  if constexpr (std::is_constructible_v<It, AnalysisPtr, std::unique_ptr<Iterator>,
                                        const IteratorContext&>) {
    return std::unique_ptr<Iterator>(new It(std::move(a), std::move(in), ctx));
  } else {
    return std::unique_ptr<Iterator>(new It(std::move(a), std::move(in)));
  }
}

// OpDef::make_iterator of a source whose iterator is It(analysis).
template <typename It>
absl::StatusOr<std::unique_ptr<Iterator>> MakeSourceIterator(AnalysisPtr a,
                                                             const IteratorContext&) {
  return std::unique_ptr<Iterator>(new It(std::move(a)));
}

}  // namespace sluice::internal
