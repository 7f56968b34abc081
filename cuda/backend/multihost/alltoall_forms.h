// all_to_all across hosts: the split matrix every rank gathers before its plan, and the form
// setting. The forms are plan builders (plan/alltoall_hosts.cpp) and the cost model that picks one
// per call is VarioPath's (varipath/across_hosts.h); every rank holds the same matrix after the
// split exchange, so every rank builds the same form.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/plan_types.h"

namespace hoccl {

// Bytes every rank sends to every rank: at(s, d) is what s sends to d.
struct SplitMatrix {
  int world = 0;
  std::vector<int64_t> bytes;     // row-major, world x world
  std::vector<int64_t> expected;  // row-major: expectedAt(d, s) is what d expects from s
  int64_t at(int s, int d) const { return bytes[static_cast<size_t>(s) * world + d]; }
  int64_t expectedAt(int d, int s) const { return expected[static_cast<size_t>(d) * world + s]; }

  // What one rank contributes to the exchange: its send bytes, then the bytes it expects, per rank.
  static std::vector<int64_t> row(const std::vector<int64_t>& sendBytes, const std::vector<int64_t>& recvBytes) {
    std::vector<int64_t> r(sendBytes);
    r.insert(r.end(), recvBytes.begin(), recvBytes.end());
    return r;
  }
  // The matrix from every rank's row (rows[r]: 2 x world values, as row() lays them out).
  static SplitMatrix fromRows(const std::vector<const int64_t*>& rows) {
    const int w = static_cast<int>(rows.size());
    SplitMatrix m{w, {}, {}};
    for (const int64_t* r : rows) {
      m.bytes.insert(m.bytes.end(), r, r + w);
      m.expected.insert(m.expected.end(), r + w, r + 2 * w);
    }
    return m;
  }
};

// HOCCL_MULTIHOST_ALLTOALL: auto (VarioPath's choice), direct or rail.
AllToAllHostsForm alltoallChoice(const std::string& setting);

}  // namespace hoccl
