// Arguments that must agree across hosts, checked before any byte crosses. Inside a host the
// local group checks its own legs; across hosts gloo does not check: a leg whose sizes differ
// between its members ends the receiving process inside gloo (an uncatchable enforce) or leaves
// part of a buffer unwritten. So every collective first exchanges a small signature with its
// rail (exchangeOnRail), and all_to_all gathers every rank's split sizes (the matrix the transfers follow) on
// every rank. A mismatch raises on every rank of the leg naming both sides, and
// breaks the group on each host so that local peers waiting in a local leg fail at once too.
// HOCCL_CHECK_ACROSS_HOSTS=0 skips the check (one message round per op) for jobs known to agree.
#include <cstring>
#include <sstream>

#include "backend/multihost/host_span.h"

namespace hoccl {

namespace {

std::string describe(const OpSignature& s) {
  std::ostringstream o;
  o << s.count << " " << (s.dtype >= 0 ? c10::toString(static_cast<at::ScalarType>(s.dtype)) : "byte")
    << (s.dtype >= 0 ? " elements" : "s");
  if (s.root >= 0) o << ", root " << s.root;
  if (s.redOp >= 0) o << ", " << redOpName(static_cast<RedOp>(s.redOp));
  return o.str();
}

std::vector<int64_t> fields(const OpSignature& s) { return {s.kind, s.dtype, s.count, s.root, s.redOp}; }

}  // namespace

void HostSpan::mismatchAcrossHosts(const char* op, const std::string& what) {
  std::string msg = "hoccl " + std::string(op) + " on rank " + std::to_string(rank_) + " (" +
                    layout_.describeHost(host_) + "): the ranks disagree across hosts: " + what;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (broken_.empty()) broken_ = msg;
  }
  pg_.abortWith(msg);
  TORCH_CHECK_VALUE(false, msg);
}

void HostSpan::agreeOnRail(const char* op, const OpSignature& mine) {
  const int members = static_cast<int>(myRail_.size());
  if (members == 1 || !checkAcrossHosts_) return;
  const std::vector<int64_t> own = fields(mine);
  const int64_t width = static_cast<int64_t>(own.size());
  std::vector<int64_t> all(static_cast<size_t>(members * width));
  exchangeOnRail(op, own.data(), all.data(), width * static_cast<int64_t>(sizeof(int64_t)));
  const int64_t* seen = all.data();
  for (int m = 0; m < members; ++m) {
    std::vector<int64_t> theirs(seen + m * width, seen + (m + 1) * width);
    if (theirs == own) continue;
    const int peer = myRail_[m];
    OpSignature other{theirs[0], theirs[1], theirs[2], theirs[3], theirs[4]};
    const std::string who = "rank " + std::to_string(peer) + " on " + layout_.describeHost(layout_.hostOf(peer));
    mismatchAcrossHosts(op, other.kind != mine.kind
                                ? who + " runs a different collective (" + collectiveName(other.kind) + ")"
                                : who + " passes " + describe(other) + ", this rank " + describe(mine));
  }
}

// The signatures travel as ordered messages of a network engine, a fixed size each, so a
// mismatch can never make gloo receive more than was posted. One message each way per rail peer,
// all posted at once: a gloo all_gather on the rail group cost a round through gloo's worker
// thread on both sides (2x2 hosts: 1.0 ms of a 1.6 ms 4 KB broadcast). The check goes over the
// rail group's own connections (railNet_, members by rail index), apart from the plans' data: on
// 2 x 2 namespaced hosts that made 16 of 20 ops of 4 KB-1 MB 1-32 % faster than checking over the
// plans' connections (docs/multihost.md).
void HostSpan::exchangeOnRail(const char* op, const void* mine, void* all, int64_t bytes) {
  NetTransport& net = *railNet_;
  std::vector<NetTransport::Handle> posted;
  try {
    for (size_t m = 0; m < myRail_.size(); ++m) {
      char* theirs = static_cast<char*>(all) + m * bytes;
      if (myRail_[m] == rank_) {
        std::memcpy(theirs, mine, static_cast<size_t>(bytes));
        continue;
      }
      posted.push_back(net.irecv(static_cast<int>(m), 0, theirs, static_cast<size_t>(bytes)));
      posted.push_back(net.isend(static_cast<int>(m), 0, mine, static_cast<size_t>(bytes)));
    }
    for (size_t i = 0; i < posted.size(); ++i) {
      net.wait(posted[i], nullptr);
      posted[i] = -1;
    }
  } catch (const std::exception& e) {
    for (NetTransport::Handle h : posted)
      if (h >= 0) net.cancel(h);
    if (dynamic_cast<const NetTransportError*>(&e)) interHostFailed(op, myRail_, e);
    throw;
  }
}

// Every pair, same-host pairs too: the plan moves those in the same run, so no host leg of its
// own would report them.
void HostSpan::checkSplits(const char* op, const SplitMatrix& m) {
  for (int from = 0; from < size_; ++from)
    for (int to = 0; to < size_; ++to) {
      if (m.at(from, to) == m.expectedAt(to, from)) continue;
      mismatchAcrossHosts(op, "rank " + std::to_string(from) + " sends " + std::to_string(m.at(from, to)) +
                                  " bytes to rank " + std::to_string(to) + ", which expects " +
                                  std::to_string(m.expectedAt(to, from)));
    }
}

const char* collectiveName(int64_t kind) {
  switch (static_cast<c10d::OpType>(kind)) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::BARRIER: return "barrier";
    default: return "another collective";
  }
}

}  // namespace hoccl
