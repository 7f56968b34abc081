// all_to_all across hosts (PlanRequest::hostOf names more than one host), in two forms.
//
// The split matrix comes from req.phases read as the list of every pair's bytes: all phases
// concatenated, a pair listed more than once moving the sum (block (s, d) is the concatenation
// of its entries, as in the single-host plans). Rank s's input block d holds what s sends to d,
// rank d's output block s what it receives from s.
//
//  hosts-direct: every non-empty cross-host block is one Send from the sender's input block into
//    the receiver's output block; the blocks between ranks of one host move as on one host (the
//    single-host plan buildPlan picks for the same-host pairs, barriers scoped to the host) while
//    the cross-host blocks are in flight. A rank sends and receives up to 2 (W - L) messages.
//    It reads only the pairs of this rank's row and column and of its host, so a request may
//    list just those; reading same-host peers in place (crossMemory), just the row and column.
//  hosts-rail: the relay of host h for rank d on another host is d's rail peer on h
//    (HostView::railPeer(h, localIndex[d])). One host leg through staging slots hands each
//    local rank its same-host blocks and the blocks it relays, packed into the message for each
//    destination in its scratch; each relay sends one message per destination it relays for
//    (every local rank's block for it, in local order) as soon as it is complete; the destination
//    receives one message per remote host into its scratch and scatters it into its outputs.
//    The same bytes cross hosts (the cross-host part of the matrix); per destination one message
//    per remote host instead of one per remote rank, for copies inside the hosts.
#include <map>
#include <tuple>

#include "plan/host_share.h"

namespace hoccl {

std::vector<int64_t> allToAllMatrix(const PlanRequest& req) {
  const int W = req.world;
  std::vector<int64_t> m(static_cast<size_t>(W) * W, 0);
  for (const auto& phase : req.phases)
    for (const auto& t : phase) m[static_cast<size_t>(t.src) * W + t.dst] += t.bytes;
  return m;
}

namespace {

// Bytes of all_to_all that stay on a host move as on one host: the single-host plan of the
// same-host pairs of this rank's host, reading peers' inputs in place where the host's ranks can
// and one host's choice says so (each rank then copies only what it receives).
Plan sameHostPlan(const PlanRequest& req, const HostView& hv) {
  const int host = hv.host(req.rank);
  PlanRequest local = req;
  local.crossMemory = req.hostReadsPeers;
  local.hostOf.clear();
  local.phases.clear();
  for (const auto& phase : req.phases) {
    TransferPhase kept;
    for (const auto& t : phase)
      if (hv.host(t.src) == host && hv.host(t.dst) == host) kept.push_back(t);
    local.phases.push_back(std::move(kept));
  }
  Plan p = buildPlan(local);
  for (auto& s : p.steps)
    if (s.kind == Step::Kind::Barrier) s.scope = Scope::Host;
  return p;
}

}  // namespace

Plan planAllToAllHostsDirect(const PlanRequest& req) {
  Plan p;
  p.algo = "alltoall/hosts-direct";
  const HostView hv(req);
  const int W = req.world, me = req.rank, host = hv.host(me);
  const std::vector<int64_t> m = allToAllMatrix(req);
  std::vector<int> ts;
  for (int s = 0; s < W; ++s)
    if (hv.host(s) != host && m[static_cast<size_t>(s) * W + me] > 0)
      ts.push_back(p.recv(s, Loc::out(s, 0), m[static_cast<size_t>(s) * W + me]));
  for (int d = 0; d < W; ++d)
    if (hv.host(d) != host && m[static_cast<size_t>(me) * W + d] > 0)
      ts.push_back(p.send(d, Loc::in(d, 0), m[static_cast<size_t>(me) * W + d]));
  Plan local = sameHostPlan(req, hv);
  p.steps.insert(p.steps.end(), local.steps.begin(), local.steps.end());
  p.buffersUsed = local.buffersUsed;
  p.waitAll(ts);
  ensureHostBarrier(p);
  // Only this host's pairs decide its slot use, so that a rank that knows its host's splits and
  // its own (no matrix gathered across hosts) plans as well as one that knows them all.
  return p;
}

namespace {

// One block of the rail form's host leg: from local rank `src`'s input block `block` to local
// rank `dst`, which relays it (`message`: the destination, `part`: where it goes in the message)
// or keeps it (message -1: its output block src).
struct LegItem {
  int src, dst, block;
  int64_t bytes;
  int message;
  int64_t part;
};

// The host leg of host h, in an order every rank derives alike: the relayed blocks by
// destination, in local order within each message, then the same-host blocks.
std::vector<LegItem> hostLeg(const HostView& hv, const std::vector<int64_t>& m, int h) {
  const int W = static_cast<int>(hv.hostOf.size());
  auto at = [&](int s, int d) { return m[static_cast<size_t>(s) * W + d]; };
  const std::vector<int>& local = hv.ranksOf[h];
  std::vector<LegItem> items;
  for (int d = 0; d < W; ++d) {
    if (hv.host(d) == h) continue;
    const int relay = hv.railPeer(h, hv.localIndex[d]);
    int64_t part = 0;
    for (int s : local) {
      if (at(s, d) > 0) items.push_back({s, relay, d, at(s, d), d, part});
      part += at(s, d);
    }
  }
  for (int d : local)
    for (int s : local)
      if (at(s, d) > 0) items.push_back({s, d, d, at(s, d), -1, 0});
  return items;
}

// Packs the host leg's items between ranks into staging rounds as the single-host plan does:
// every source fills its slot in item order, a block larger than what is left takes the next
// round. Calls round(b, [(item, offset in the block, bytes, offset in the source's slot)]) per round.
template <typename Fn>
int stageRounds(const PlanRequest& req, const std::vector<LegItem>& items, Fn&& round) {
  struct Left { size_t item; int64_t moved; };
  std::vector<Left> pending;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].src != items[i].dst) pending.push_back({i, 0});
  int rounds = 0;
  while (!pending.empty()) {
    std::vector<int64_t> fill(req.world, 0);
    std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>> moves;
    std::vector<Left> left;
    for (Left l : pending) {
      const LegItem& it = items[l.item];
      const int64_t take = std::min<int64_t>(it.bytes - l.moved, req.slotBytes - fill[it.src]);
      if (take > 0) {
        moves.emplace_back(l.item, l.moved, take, fill[it.src]);
        fill[it.src] += take;
        l.moved += take;
      }
      if (l.moved < it.bytes) left.push_back(l);
    }
    round(rounds++, moves);
    pending.swap(left);
  }
  return rounds;
}

}  // namespace

Plan planAllToAllHostsRail(const PlanRequest& req) {
  Plan p;
  p.algo = "alltoall/hosts-rail";
  const HostView hv(req);
  const int W = req.world, me = req.rank, host = hv.host(me);
  const std::vector<int64_t> m = allToAllMatrix(req);
  auto at = [&](int s, int d) { return m[static_cast<size_t>(s) * W + d]; };

  // What arrives: one message per remote host from its relay for me, that host's blocks for me
  // in its rank order.
  struct Arrival { int host; int64_t at; int transfer; };
  std::vector<Arrival> arrivals;
  for (int h = 0; h < hv.hosts(); ++h) {
    if (h == host) continue;
    int64_t bytes = 0;
    for (int s : hv.ranksOf[h]) bytes += at(s, me);
    if (bytes == 0) continue;
    const int64_t off = p.reserveScratch(bytes);
    arrivals.push_back({h, off, p.recv(hv.railPeer(h, hv.localIndex[me]), Loc::scratch(off), bytes)});
  }

  // The messages I relay, packed in my scratch; each leaves once its last byte is in.
  const std::vector<LegItem> items = hostLeg(hv, m, host);
  std::map<int, int64_t> messageAt, messageBytes, missing;
  for (const LegItem& it : items)
    if (it.dst == me && it.message >= 0) messageBytes[it.message] += it.bytes;
  for (const auto& [d, bytes] : messageBytes) {
    messageAt[d] = p.reserveScratch(bytes);
    missing[d] = bytes;
  }
  std::vector<int> sends;
  auto landed = [&](const LegItem& it, int64_t bytes) {
    if (it.message >= 0 && (missing[it.message] -= bytes) == 0)
      sends.push_back(p.send(it.message, Loc::scratch(messageAt[it.message]), messageBytes[it.message]));
  };
  auto to = [&](const LegItem& it, int64_t off) {
    return it.message >= 0 ? Loc::scratch(messageAt[it.message] + it.part + off) : Loc::out(it.src, off);
  };
  for (const LegItem& it : items)  // my own blocks need no slot
    if (it.src == me && it.dst == me) {
      p.steps.push_back(Step::copy(to(it, 0), Loc::in(it.block, 0), it.bytes));
      landed(it, it.bytes);
    }
  stageRounds(req, items, [&](int b, const auto& moves) {
    p.buffersUsed = b + 1;
    for (const auto& [i, off, n, slotAt] : moves)
      if (items[i].src == me) p.steps.push_back(Step::copy(Loc::slot(me, b, slotAt), Loc::in(items[i].block, off), n));
    p.steps.push_back(Step::barrier(Scope::Host));
    for (const auto& [i, off, n, slotAt] : moves)
      if (items[i].dst == me) {
        p.steps.push_back(Step::copy(to(items[i], off), Loc::slot(items[i].src, b, slotAt), n));
        landed(items[i], n);
      }
  });
  for (const auto& a : arrivals) {
    p.wait(a.transfer);
    int64_t off = a.at;
    for (int s : hv.ranksOf[a.host]) {
      if (at(s, me) > 0) p.steps.push_back(Step::copy(Loc::out(s, 0), Loc::scratch(off), at(s, me)));
      off += at(s, me);
    }
  }
  p.waitAll(sends);
  ensureHostBarrier(p);
  return p;
}

}  // namespace hoccl
