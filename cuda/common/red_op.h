// The reduction ops every layer names: c10d's ReduceOp as hoccl's own small enum, so that plans,
// executors and transports need no c10d header.
#pragma once
#include <cstdint>

namespace hoccl {

enum class RedOp : int8_t { Sum, Avg, Product, Min, Max, PremulSum, BitAnd, BitOr, BitXor };

// c10d's spelling ("SUM", "PREMUL_SUM", ...), for error messages.
const char* redOpName(RedOp op);

}  // namespace hoccl
