#include <tensortap/kinds.h>

namespace tensortap {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Activation: return "activation";
    case Kind::ActivationGrad: return "activation_grad";
    case Kind::Param: return "param";
    case Kind::Grad: return "grad";
    case Kind::Tensor: return "tensor";
    case Kind::Buffer: return "buffer";
  }
  return "unknown";
}

}  // namespace tensortap
