// all_to_all across hosts on the legs: the split matrix every rank gathers, the form setting,
// and the relay of each block. The forms and the cost model that picks one per call are
// VarioPath's (varipath/across_hosts.h); every rank holds the same matrix after the split
// exchange, so every rank runs the same form.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/multihost/host_layout.h"
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

// The rank of host `srcHost` that relays every block of that host destined for rank `dst`.
int relayFor(const HostLayout& layout, int srcHost, int dst);

// The form to run: the forced one, else VarioPath's choice for this matrix (varipath/across_hosts.h).
AllToAllHostsForm chooseForm(AllToAllHostsForm forced, const HostLayout& layout, const SplitMatrix& m,
                             const NetCosts& costs);

}  // namespace hoccl
