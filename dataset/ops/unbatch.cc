// Unbatch(): each element split along dimension 0 (all components agree).
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Unbatch"));
  a.spec.known = in->spec.known;
  for (size_t i = 0; i < in->spec.components.size(); ++i) {
    ComponentSpec o = in->spec.components[i];
    if (o.shape) {
      if (o.shape->empty()) {
        return Invalid("Unbatch",
                       absl::StrCat("component ", i, " is a scalar; Unbatch needs rank >= 1"));
      }
      o.shape->erase(o.shape->begin());
    }
    a.spec.components.push_back(std::move(o));
  }
  a.cardinality =
      in->cardinality == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality;
  return absl::OkStatus();
}

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
      cur_key_ = in_->ElementKey();
      row_ = 0;
    }
    Element out;
    for (const Tensor& t : cur_) {
      SLUICE_ASSIGN_OR_RETURN(Tensor r, Row(t, row_));
      out.push_back(std::move(r));
    }
    key_ = cur_key_ ? std::optional<uint64_t>(Mix(*cur_key_, static_cast<uint64_t>(row_)))
                    : std::nullopt;
    ++row_;
    return Some(std::move(out));
  }
  // Row i of an element keyed k is keyed Mix(k, i).
  std::optional<uint64_t> ElementKey() const override { return key_; }
  // The element being split with its key, the row, and the input.
  absl::Status SaveState(proto::IteratorState* state) const override {
    if (row_ < rows_) SLUICE_RETURN_IF_ERROR(SaveElement(cur_, state));
    return SaveWithInput(state, {row_, rows_, cur_key_.has_value(),
                                 static_cast<int64_t>(cur_key_.value_or(0))});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t has_key = 0, key = 0;
    SLUICE_RETURN_IF_ERROR(RestoreWithInput(state, {&row_, &rows_, &has_key, &key}));
    if (row_ < rows_) {
      SLUICE_ASSIGN_OR_RETURN(cur_, RestoreElement(state, 0));
    }
    cur_key_ = has_key != 0 ? std::optional<uint64_t>(static_cast<uint64_t>(key)) : std::nullopt;
    return absl::OkStatus();
  }

 private:
  Element cur_;
  std::optional<uint64_t> cur_key_, key_;
  int64_t row_ = 0, rows_ = 0;
};

}  // namespace

extern const OpDef kUnbatchOp = {
    .name = "Unbatch",
    .inputs = &InputField<&proto::DatasetNode::unbatch>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_unbatch>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<UnbatchIterator>,
    .split_passing = SplitPassing::kTracked,
};

}  // namespace sluice::internal
