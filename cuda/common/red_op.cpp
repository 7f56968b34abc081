#include "common/red_op.h"

namespace hoccl {

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "SUM";
    case RedOp::Avg: return "AVG";
    case RedOp::Product: return "PRODUCT";
    case RedOp::Min: return "MIN";
    case RedOp::Max: return "MAX";
    case RedOp::PremulSum: return "PREMUL_SUM";
    case RedOp::BitAnd: return "BAND";
    case RedOp::BitOr: return "BOR";
    case RedOp::BitXor: return "BXOR";
  }
  return "?";
}

}  // namespace hoccl
