// Map(fn): fn applied to each element.
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Map"));
  SLUICE_ASSIGN_OR_RETURN(a.fn, CompiledFunction::Compile(a.node->map().fn(), in->spec, "Map"));
  a.spec = a.fn->output_spec();
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

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

}  // namespace

extern const OpDef kMapOp = {
    .name = "Map",
    .inputs = &InputField<&proto::DatasetNode::map>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_map>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<MapIterator>,
    .split_passing = SplitPassing::kTracked,
};

}  // namespace sluice::internal
