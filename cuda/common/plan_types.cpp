#include "common/plan_types.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace hoccl {

const char* opKindName(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Barrier: return "barrier";
  }
  return "?";
}

int Plan::post(Step s, std::vector<int>& perPeer) {
  if (perPeer.size() <= static_cast<size_t>(s.peer)) perPeer.resize(s.peer + 1, 0);
  s.message = perPeer[s.peer]++;
  s.transfer = transfers++;
  steps.push_back(std::move(s));
  return steps.back().transfer;
}

int Plan::send(int peer, Loc src, int64_t bytes) {
  Step s{Step::Kind::Send};
  s.peer = peer; s.src = src; s.bytes = bytes;
  return post(std::move(s), sentTo_);
}

int Plan::recv(int peer, Loc dst, int64_t bytes) {
  Step s{Step::Kind::Recv};
  s.peer = peer; s.dst = dst; s.bytes = bytes;
  return post(std::move(s), receivedFrom_);
}

void Plan::wait(int transfer) {
  Step s{Step::Kind::Wait};
  s.transfer = transfer;
  steps.push_back(std::move(s));
}

void Plan::waitAll(const std::vector<int>& ts) {
  for (int t : ts) wait(t);
}

int64_t Plan::reserveScratch(int64_t bytes) {
  const int64_t at = (scratchBytes + 7) / 8 * 8;
  scratchBytes = at + bytes;
  return at;
}

int Plan::barriers() const {
  int n = 0;
  for (const auto& s : steps) n += s.kind == Step::Kind::Barrier;
  return n;
}

bool Plan::readsPeers() const {
  for (const auto& s : steps) {
    if (s.src.remote()) return true;
    for (const auto& l : s.srcs)
      if (l.remote()) return true;
  }
  return false;
}

bool Plan::crossesHosts() const {
  return std::any_of(steps.begin(), steps.end(), [](const Step& s) { return s.isTransfer(); });
}

int PlanRequest::hosts() const {
  if (hostOf.empty()) return 1;
  return *std::max_element(hostOf.begin(), hostOf.end()) + 1;
}

static std::string locStr(const Loc& l) {
  std::ostringstream os;
  if (l.space == Space::In) os << "in[" << l.index << "]+" << l.offset;
  else if (l.space == Space::Out) os << "out[" << l.index << "]+" << l.offset;
  else if (l.space == Space::Slot) os << "slot[r" << l.index << ",b" << l.buf << "]+" << l.offset;
  else if (l.space == Space::Scratch) os << "scratch+" << l.offset;
  else os << (l.space == Space::PeerIn ? "peer_in[r" : "peer_out[r") << l.buf << "," << l.index << "]+" << l.offset;
  return os.str();
}

std::string Plan::describe() const {
  std::ostringstream os;
  os << "plan " << algo << ": " << steps.size() << " steps, " << barriers() << " barriers, "
     << buffersUsed << " buffers";
  if (transfers) os << ", " << transfers << " transfers, " << scratchBytes << "B scratch";
  os << "\n";
  for (const auto& s : steps) {
    switch (s.kind) {
      case Step::Kind::Barrier: os << (s.scope == Scope::Host ? "  barrier host\n" : "  barrier\n"); break;
      case Step::Kind::Copy:
        os << "  copy " << locStr(s.dst) << " <- " << locStr(s.src) << " " << s.bytes << "B\n";
        break;
      case Step::Kind::Reduce:
        os << "  reduce " << locStr(s.dst) << " <-";
        for (const auto& l : s.srcs) os << " " << locStr(l);
        os << " x" << s.count << (s.finalize ? " finalize" : "") << "\n";
        break;
      case Step::Kind::Send:
        os << "  send #" << s.transfer << " r" << s.peer << "." << s.message << " <- " << locStr(s.src) << " "
           << s.bytes << "B\n";
        break;
      case Step::Kind::Recv:
        os << "  recv #" << s.transfer << " r" << s.peer << "." << s.message << " -> " << locStr(s.dst) << " "
           << s.bytes << "B\n";
        break;
      case Step::Kind::Wait: os << "  wait #" << s.transfer << "\n"; break;
    }
  }
  return os.str();
}

}  // namespace hoccl
