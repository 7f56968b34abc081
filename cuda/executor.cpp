#include "executor.h"

#include <cstring>

namespace hoccl {

char* Executor::resolve(const Loc& loc, const ExecContext& ctx) const {
  switch (loc.space) {
    case Space::In: return ctx.in[loc.index] + loc.offset;
    case Space::Out: return ctx.out[loc.index] + loc.offset;
    case Space::Slot: return group_.slot(loc.index, (bufCursor_ + loc.buf) & 1) + loc.offset;
  }
  return nullptr;
}

void Executor::run(const Plan& plan, ExecContext& ctx) {
  bool first = true;
  std::vector<const void*> srcs;
  for (const Step& step : plan.steps) {
    switch (step.kind) {
      case Step::Kind::Copy: {
        char* dst = resolve(step.dst, ctx);
        const char* src = resolve(step.src, ctx);
        if (dst != src) std::memcpy(dst, src, static_cast<size_t>(step.bytes));
        break;
      }
      case Step::Kind::Reduce: {
        srcs.clear();
        for (const Loc& l : step.srcs) srcs.push_back(resolve(l, ctx));
        char* dst = resolve(step.dst, ctx);
        reduceInto(dst, srcs.data(), static_cast<int>(srcs.size()), step.count, ctx.dtype, ctx.op);
        if (step.finalize) postScale(dst, step.count, ctx.dtype, ctx.op, ctx.factor, group_.world());
        break;
      }
      case Step::Kind::Barrier: {
        uint32_t index = ++barriers_;
        if (first) group_.control(group_.rank()).desc[index & 1] = ctx.desc;
        group_.arrive(index);
        group_.waitAll(index, ctx.check);
        if (first && ctx.validate) ctx.validate(index & 1);
        first = false;
        break;
      }
    }
  }
  bufCursor_ += static_cast<uint32_t>(plan.buffersUsed);
}

}  // namespace hoccl
