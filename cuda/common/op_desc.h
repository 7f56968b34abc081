// The descriptor each rank publishes with the first barrier of an op: the backend fills it, a
// transport carries it, the backend compares every rank's.
#pragma once
#include <cstdint>

namespace hoccl {

// What each rank says it is doing; peers compare these after the first barrier of every op.
struct OpDesc {
  uint32_t opSeq;
  int8_t kind;
  int8_t dtype;
  int8_t redop;
  int8_t coresShared;  // the publisher's view (backend/core_sharing.h): its group agrees on the next op's rounds
  int32_t root;
  int32_t pad2;
  int64_t numel;  // the size every rank must agree on (op-specific meaning)
  int64_t aux;    // op-specific second check (e.g. output numel)
};

}  // namespace hoccl
