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

#include "backend/multihost/multihost_group.h"

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

void MultiHostGroup::mismatchAcrossHosts(const char* op, const std::string& what) {
  std::string msg = "hoccl " + std::string(op) + " on rank " + std::to_string(rank_) + " (" +
                    layout_.describeHost(host_) + "): the ranks disagree across hosts: " + what;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (broken_.empty()) broken_ = msg;
  }
  groups_.local->abortWith(msg);
  TORCH_CHECK_VALUE(false, msg);
}

void MultiHostGroup::agreeOnRail(const char* op, const OpSignature& mine) {
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

// The signatures travel as ordered messages of the network engine, a fixed size each, so a
// mismatch can never make gloo receive more than was posted. One message each way per rail peer,
// all posted at once: a gloo all_gather on the rail group cost a round through gloo's worker
// thread on both sides (2x2 hosts: 1.0 ms of a 1.6 ms 4 KB broadcast).
void MultiHostGroup::exchangeOnRail(const char* op, const void* mine, void* all, int64_t bytes) {
  std::vector<NetTransport::Handle> posted;
  try {
    for (size_t m = 0; m < myRail_.size(); ++m) {
      char* theirs = static_cast<char*>(all) + m * bytes;
      if (myRail_[m] == rank_) {
        std::memcpy(theirs, mine, static_cast<size_t>(bytes));
        continue;
      }
      posted.push_back(net_->irecv(myRail_[m], 0, theirs, static_cast<size_t>(bytes)));
      posted.push_back(net_->isend(myRail_[m], 0, mine, static_cast<size_t>(bytes)));
    }
    for (size_t i = 0; i < posted.size(); ++i) {
      net_->wait(posted[i], nullptr);
      posted[i] = -1;
    }
  } catch (const std::exception& e) {
    for (NetTransport::Handle h : posted)
      if (h >= 0) net_->cancel(h);
    if (dynamic_cast<const NetTransportError*>(&e)) interHostFailed(op, myRail_, e);
    throw;
  }
}

// Every rank needs the whole split matrix to report a mismatch the same way everywhere. A gloo
// all_gather over all ranks is a ring of W-1 hops; instead a host first gathers its rows in
// shared memory, then sends them to the ranks of every other host in one parallel hop: rank l
// of host h serves the ranks m of host h' with m % L(h) == l, so every rank hears from exactly
// one rank of each other host, whatever the hosts' sizes.
// The send rows form the split matrix the all_to_all forms plan from (alltoall_forms.h).
SplitMatrix MultiHostGroup::exchangeSplits(const char* op, const std::vector<int64_t>& sendBytes,
                                           const std::vector<int64_t>& recvBytes, bool check) {
  const int64_t width = 2 * size_;
  const std::vector<int64_t> own = SplitMatrix::row(sendBytes, recvBytes);
  const auto& hostRanks = layout_.table.ranksOf;
  at::Tensor ownRow = at::tensor(own, at::kLong);
  at::Tensor hostRows = at::empty({layout_.localSize(host_) * width}, at::kLong);
  local(op, [&](ProcessGroupHOCCL& g) { return g._allgather_base(hostRows, ownRow, c10d::AllgatherOptions()); });

  std::vector<at::Tensor> rowsOf(layout_.hosts());
  rowsOf[host_] = hostRows;
  const int tag = crossTag();
  std::vector<c10::intrusive_ptr<c10d::Work>> exchange;
  auto post = [&](bool isSend, int peer, const at::Tensor& rows) {
    exchange.push_back(startTransfer(op, *groups_.global, allRanks_, isSend, peer, rows, tag));
  };
  const int mySize = layout_.localSize(host_);
  for (int h = 0; h < layout_.hosts(); ++h) {
    if (h == host_) continue;
    const int theirSize = layout_.localSize(h);
    rowsOf[h] = at::empty({theirSize * width}, at::kLong);
    post(false, hostRanks[h][localRank_ % theirSize], rowsOf[h]);
    for (int m = localRank_; m < theirSize; m += mySize) post(true, hostRanks[h][m], hostRows);
  }
  for (auto& w : exchange) waitAcross(op, allRanks_, w);

  std::vector<const int64_t*> row(size_);
  for (int h = 0; h < layout_.hosts(); ++h)
    for (size_t i = 0; i < hostRanks[h].size(); ++i) row[hostRanks[h][i]] = rowsOf[h].data_ptr<int64_t>() + i * width;
  const SplitMatrix matrix = SplitMatrix::fromRows(row);
  if (check) checkSplits(op, matrix, false);
  return matrix;
}

// Same-host pairs are the local leg's to report, unless a form packs them into a leg of its own.
void MultiHostGroup::checkSplits(const char* op, const SplitMatrix& m, bool sameHostToo) {
  for (int from = 0; from < size_; ++from)
    for (int to = 0; to < size_; ++to) {
      if (m.at(from, to) == m.expectedAt(to, from)) continue;
      if (!sameHostToo && layout_.hostOf(from) == layout_.hostOf(to)) continue;
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
