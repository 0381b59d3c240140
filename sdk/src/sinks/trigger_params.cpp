#include "sdk/src/sinks/trigger_params.h"

namespace tensortap::detail {

std::uint32_t trigger_params(Trigger::Type t) {
  using T = Trigger::Type;
  switch (t) {
    case T::VanishingGradient: return kParamKinds | kParamInclude | kParamThreshold | kParamPatience;
    case T::ExplodingTensor: return kParamKinds | kParamInclude | kParamBound;
    case T::AllZero: return kParamKinds | kParamInclude | kParamPatience;
    case T::UnchangedTensor: return kParamInclude | kParamNumSteps;
    case T::LossNotDecreasing: return kParamName | kParamWindow | kParamMinDecrease | kParamMinProgress;
    case T::DeadRelu: return kParamInclude | kParamThreshold | kParamPatience;
    case T::SaturatedActivation: return kParamInclude | kParamDerivative | kParamThreshold | kParamPatience;
    case T::TensorVariance: return kParamKinds | kParamInclude | kParamFactor | kParamWindow;
    case T::PoorWeightInitialization: return kParamInclude | kParamThreshold;
    case T::WeightUpdateRatio: return kParamInclude | kParamLarge | kParamSmall | kParamPatience;
    case T::NonFinite:
    case T::Spike:
    case T::NormJump:
    case T::When: break;
  }
  return 0;
}

const char* trigger_param_name(TriggerParam p) {
  switch (p) {
    case kParamKinds: return "kinds";
    case kParamInclude: return "include";
    case kParamThreshold: return "threshold";
    case kParamPatience: return "patience";
    case kParamBound: return "bound";
    case kParamNumSteps: return "num_steps";
    case kParamWindow: return "window";
    case kParamFactor: return "factor";
    case kParamName: return "name";
    case kParamMinDecrease: return "min_decrease";
    case kParamMinProgress: return "min_progress";
    case kParamDerivative: return "derivative";
    case kParamLarge: return "large";
    case kParamSmall: return "small";
  }
  return "?";
}

}  // namespace tensortap::detail
