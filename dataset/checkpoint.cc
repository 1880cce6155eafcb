// Checkpoints of local iterators (Iterator::Save, Dataset::MakeIterator
// with a checkpoint): the framing (format version, the pipeline's
// fingerprint, the iteration's salt and seed) and the helpers the ops use
// to save and restore their part (ops/op.h). docs/datasets.md,
// "Checkpoints".
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/frame.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/ops/op.h"

namespace sluice {

absl::StatusOr<std::string> Iterator::Save() const {
  return absl::UnimplementedError("this iterator cannot save its position");
}

absl::Status Iterator::SaveState(proto::IteratorState*) const {
  return absl::UnimplementedError("this iterator cannot save its position");
}

absl::Status Iterator::RestoreState(const proto::IteratorState&) {
  return absl::UnimplementedError("this iterator cannot restore a position");
}

namespace internal {

std::string OpNameOf(const proto::DatasetNode& node) {
  const OpDef* op = FindOp(node.op_case());
  return op != nullptr ? op->name : "an empty node";
}

absl::Status NodeIterator::SaveState(proto::IteratorState*) const {
  return absl::UnimplementedError(absl::StrCat(
      OpNameOf(node()), " cannot save its position yet (Iterator::Save); the pipeline's "
      "other ops can (docs/datasets.md, \"Checkpoints\")"));
}

absl::Status NodeIterator::RestoreState(const proto::IteratorState&) {
  return absl::UnimplementedError(
      absl::StrCat(OpNameOf(node()), " cannot restore a position (Iterator::Save)"));
}

absl::Status NodeIterator::BeginSave(proto::IteratorState* state) const {
  state->set_op(OpNameOf(node()));
  return absl::OkStatus();
}

absl::Status NodeIterator::CheckState(const proto::IteratorState& state, int values,
                                      int inputs) const {
  const std::string op = OpNameOf(node());
  if (state.op() != op) {
    return CorruptCheckpoint(absl::StrCat("it saved ", state.op().empty() ? "nothing" : state.op(),
                                          " where the pipeline has ", op));
  }
  if (state.values_size() != values || state.inputs_size() != inputs) {
    return CorruptCheckpoint(absl::StrCat(op, " saved ", state.values_size(), " value(s) and ",
                                          state.inputs_size(), " input(s); expected ", values,
                                          " and ", inputs));
  }
  return absl::OkStatus();
}

absl::Status NodeIterator::SaveValues(proto::IteratorState* state,
                                      std::initializer_list<int64_t> values) const {
  SLUICE_RETURN_IF_ERROR(BeginSave(state));
  for (int64_t v : values) state->add_values(v);
  return absl::OkStatus();
}

absl::Status NodeIterator::RestoreValues(const proto::IteratorState& state,
                                         std::initializer_list<int64_t*> values,
                                         int inputs) const {
  SLUICE_RETURN_IF_ERROR(CheckState(state, static_cast<int>(values.size()), inputs));
  int i = 0;
  for (int64_t* v : values) *v = state.values(i++);
  return absl::OkStatus();
}

absl::Status SaveHeld(const std::vector<const HeldResult*>& held, proto::IteratorState* state) {
  int64_t elements = 0, terminal = 0, code = 0;
  for (const HeldResult* h : held) {
    if (h->result.ok() && h->result->has_value()) {
      SLUICE_RETURN_IF_ERROR(SaveElement(**h->result, state));
      ++elements;
      continue;
    }
    terminal = h->result.ok() ? 1 : 2;  // what follows it is never delivered
    if (!h->result.ok()) {
      code = static_cast<int64_t>(h->result.status().code());
      state->set_blob(std::string(h->result.status().message()));
    }
    break;
  }
  for (int64_t v : {elements, terminal, code}) state->add_values(v);
  for (int64_t i = 0; i < elements; ++i) {
    state->add_values(held[i]->key.has_value());
    state->add_values(static_cast<int64_t>(held[i]->key.value_or(0)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HeldResult>> RestoreHeld(const proto::IteratorState& state,
                                                    int first) {
  if (first < 0 || state.values_size() < first + 3) {
    return CorruptCheckpoint(absl::StrCat(state.op(), " saved no held results"));
  }
  const int64_t elements = state.values(first), terminal = state.values(first + 1);
  if (elements != state.elements_size() || terminal < 0 || terminal > 2 ||
      state.values_size() != first + 3 + 2 * elements) {
    return CorruptCheckpoint(absl::StrCat(state.op(), "'s held results do not add up"));
  }
  std::vector<HeldResult> out;
  for (int i = 0; i < elements; ++i) {
    SLUICE_ASSIGN_OR_RETURN(Element e, RestoreElement(state, i));
    HeldResult h{Result(std::optional<Element>(std::move(e))), std::nullopt};
    if (state.values(first + 3 + 2 * i) != 0) {
      h.key = static_cast<uint64_t>(state.values(first + 4 + 2 * i));
    }
    out.push_back(std::move(h));
  }
  if (terminal == 1) out.push_back({Result(std::optional<Element>()), std::nullopt});
  if (terminal == 2) {
    const auto code = static_cast<absl::StatusCode>(state.values(first + 2));
    out.push_back({Result(absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown
                                                                     : code,
                                       state.blob())),
                   std::nullopt});
  }
  return out;
}

absl::Status CorruptCheckpoint(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("the checkpoint does not fit this pipeline or is corrupt: ", why));
}

absl::Status SaveElement(const Element& e, proto::IteratorState* state) {
  SLUICE_ASSIGN_OR_RETURN(OwnedFrame f, EncodeFrame(e));
  state->add_elements(reinterpret_cast<const char*>(f.data.get()), f.size);
  return absl::OkStatus();
}

absl::StatusOr<Element> RestoreElement(const proto::IteratorState& state, int i) {
  if (i < 0 || i >= state.elements_size()) {
    return CorruptCheckpoint(absl::StrCat(state.op(), " holds no element ", i));
  }
  const std::string& bytes = state.elements(i);
  // Frames are decoded in place; give them the alignment they were written with.
  std::shared_ptr<uint8_t> buf(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes.size() + 63) / 64 * 64 + 64)),
                               [](uint8_t* p) { std::free(p); });
  if (buf == nullptr) return absl::ResourceExhaustedError("cannot allocate a restored element");
  std::memcpy(buf.get(), bytes.data(), bytes.size());
  auto decoded = DecodeFrame(buf.get(), bytes.size(), buf);
  if (!decoded.ok()) {
    return CorruptCheckpoint(absl::StrCat(state.op(), "'s element ", i, ": ",
                                          decoded.status().message()));
  }
  return std::move(decoded->element);
}

namespace {

// The states a service iterator saved (op Distribute, with a position).
void FindServiceStates(const proto::IteratorState& state,
                       std::vector<const proto::IteratorState*>* out) {
  if (state.op() == kDataServiceOpName && !state.blob().empty()) out->push_back(&state);
  for (const proto::IteratorState& in : state.inputs()) FindServiceStates(in, out);
}

// The iterator Dataset::MakeIterator returns: what Save() frames.
class RootIterator : public Iterator {
 public:
  RootIterator(std::unique_ptr<Iterator> in, uint64_t fingerprint, const IteratorContext& ctx)
      : in_(std::move(in)), fingerprint_(fingerprint), salt_(ctx.salt), seed_(ctx.seed) {}
  absl::StatusOr<std::optional<Element>> Next() override { return in_->Next(); }
  std::optional<uint64_t> ElementKey() const override { return in_->ElementKey(); }
  int64_t ElementSplit() const override { return in_->ElementSplit(); }
  absl::StatusOr<std::string> Save() const override {
    proto::IteratorCheckpoint c;
    c.set_format_version(kCheckpointFormatVersion);
    c.set_fingerprint(fingerprint_);
    c.set_salt(salt_);
    c.set_seed(seed_);
    SLUICE_RETURN_IF_ERROR(in_->SaveState(c.mutable_root()));
    return c.SerializeAsString();
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return in_->SaveState(state);
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return in_->RestoreState(state);
  }

 private:
  std::unique_ptr<Iterator> in_;
  const uint64_t fingerprint_, salt_, seed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Iterator>> MakeRootIterator(AnalysisPtr analysis,
                                                           const IteratorContext& ctx,
                                                           uint64_t fingerprint) {
  SLUICE_ASSIGN_OR_RETURN(auto it, MakeNodeIterator(std::move(analysis), ctx));
  return std::unique_ptr<Iterator>(new RootIterator(std::move(it), fingerprint, ctx));
}

absl::StatusOr<std::unique_ptr<Iterator>> RestoreRootIterator(AnalysisPtr analysis,
                                                              IteratorContext ctx,
                                                              uint64_t fingerprint,
                                                              const std::string& checkpoint) {
  proto::IteratorCheckpoint c;
  if (!c.ParseFromString(checkpoint)) {
    return absl::InvalidArgumentError(
        "the checkpoint cannot be parsed: truncated, corrupt or not a sluice checkpoint");
  }
  if (c.format_version() != kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint has format version ", c.format_version(), "; this sluice reads version ",
        kCheckpointFormatVersion));
  }
  if (c.fingerprint() != fingerprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint is of another pipeline (fingerprint ", c.fingerprint(),
        "; this dataset's is ", fingerprint, ")"));
  }
  ctx.salt = c.salt();
  ctx.seed = c.seed();
  // A service iterator's position is where its iteration is created, not
  // restored after: found here and handed to the first one made.
  std::vector<const proto::IteratorState*> service;
  FindServiceStates(c.root(), &service);
  if (service.size() > 1) {
    return absl::UnimplementedError(
        "the checkpoint holds the positions of several Distribute iterators; a pipeline "
        "resumes one service iteration");
  }
  if (!service.empty()) {
    ctx.service_resume = std::make_shared<ServiceResume>();
    ctx.service_resume->checkpoint = service[0]->blob();
  }
  SLUICE_ASSIGN_OR_RETURN(auto it, MakeRootIterator(std::move(analysis), ctx, fingerprint));
  SLUICE_RETURN_IF_ERROR(it->RestoreState(c.root()));
  return it;
}

}  // namespace internal
}  // namespace sluice
