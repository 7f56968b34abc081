// A VarioPath plan: a sequence of phases, each a set of transfers started together.
#pragma once

#include <cstdint>
#include <vector>

namespace hoccl {
namespace varipath {

struct Transfer {
  int32_t src;
  int32_t dst;
  int64_t bytes;
};
using Phase = std::vector<Transfer>;

}  // namespace varipath
}  // namespace hoccl
