// all_reduce (and rooted reduce, plan/reduce_hosts.cpp) across hosts: one pipeline, two forms.
//
//  leaders: every rank of a host stages its chunk, the host leader (local rank 0) reduces the
//           host's slots into a partial, leaders exchange partials (each sends its own to every
//           other leader), every leader reduces all hosts' partials in host order with finalize
//           into its slot, the host's ranks copy it out. For small payloads and uneven hosts.
//  rails:   even hosts, L ranks each: local rank l owns 1/L of every chunk (a share). It reduces
//           its share over its host's slots into a partial that crosses hosts on rail l (the
//           ranks with local index l): the rail reduce-scatters (member of host p reduces
//           piece p of the share) and all-gathers the reduced pieces, so each host sends and
//           receives 2(H-1)/H of the payload, the hierarchical minimum; on 2 hosts an op of one
//           chunk goes in one hop instead (each member sends its whole partial to the other and
//           both reduce: the same bytes, one latency). Then the host's ranks copy every share
//           out of its owner's slot.
//
// Every element's final value is computed by one rank from the same partials in host order (or,
// on a 2-host rail and among leaders, by every member from bitwise identical partials in the
// same order), so every rank ends with the same bytes.
//
// Pipeline: chunk j is staged before barrier B_j; after B_j its owners reduce their shares and
// post the chunk's transfers, then finish chunk j-1 (wait, reduce in host order, post and wait
// the all-gather hop), copy out chunk j-2 and stage chunk j+1. So chunk j's transfers are in
// flight while the host works on chunk j+1, and there is one host barrier per chunk (two more at
// the end; one in all on a host with one rank).
//
// Direct reads (large payloads, when the host's ranks can read each other's buffers; rails, not
// rooted): nothing is staged. The owner of a share reduces it from its host's inputs in place
// (cross-memory reads), writes the final value into its own output (no other rank reads that
// range of its input), and the host's ranks copy each share from its owner's output. Chunking,
// messages and slot cursor are those of the staged plan, so hosts may differ in this choice.
// Input ranges of chunk j are read before B_(j+1) and overwritten by copy-out after B_(j+2); an
// owner's output is read after B_(j+2) and written before it; a last host barrier keeps every
// output in place until its readers are done.
//
// Staging buffers (slots) are double-buffered by chunk parity. A slot holds one region per share
// (region m at m x regionBytes); rank l stages into every region but its own share's and writes
// the final value of its share into its own region, so staging chunk j+1 and finishing chunk j-1
// (the same parity) touch disjoint bytes. Partials and received partials live in Scratch,
// double-buffered by chunk parity too. After the plan's last barrier only its last buffer is
// read, and before its first barrier only its first is written (the invariant every plan keeps
// for the next op on the host).
#include <algorithm>
#include <stdexcept>

#include "common/host_view.h"
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

bool reductionUsesRails(const PlanRequest& req) {
  const HostView hv(req);
  if (!hv.even) return false;
  const int L = hv.localSize(0);
  return req.bytes > req.leaderMaxBytes && req.bytes / req.elemSize >= L;
}

namespace {

class HostsReduction {
 public:
  HostsReduction(const PlanRequest& req, bool rails, bool rooted, const char* algo)
      : req_(req), hv_(req), rooted_(rooted) {
    p_.algo = algo;
    me_ = req.rank;
    host_ = hv_.host(me_);
    local_ = hv_.localIndex[me_];
    L_ = hv_.localSize(host_);
    H_ = hv_.hosts();
    es_ = req.elemSize;
    if (rails && !hv_.even) throw std::logic_error("hoccl: the rails form needs the same ranks on every host");
    owners_ = rails ? hv_.localSize(0) : 1;
    rootHost_ = rooted ? hv_.host(req.root) : -1;
    direct_ = rails && !rooted && hv_.localSize(host_) > 1 && req.hostReadsPeers &&
              req.bytes >= req.crossMemoryMinBytes;
    // Regions of at most netChunkBytes (the largest message), owners_ of them in a slot.
    int64_t regionElems = req.slotBytes / owners_ / es_;
    if (req.netChunkBytes > 0) regionElems = std::min(regionElems, req.netChunkBytes / es_);
    regionElems_ = std::max<int64_t>(1, regionElems);
    chunkElems_ = regionElems_ * owners_;
    total_ = req.bytes / es_;
    chunks_ = (total_ + chunkElems_ - 1) / chunkElems_;
    // On two hosts the one-hop form sends what the reduce-scatter and all-gather send together,
    // but reduces the whole share on both rail members. Once the op is pipelined the all-gather's
    // extra hop costs only the last chunk's latency, and halving that reduction is what brings the
    // plan closer to the link on shared cores (docs/multihost.md). Every host sees the same
    // request, so all agree on the form.
    rsag_ = rails && !rooted && (H_ > 2 || (chunks_ > 1 && L_ > 1));
    // Where no slot holds results (direct reads, or one rank per host) the all-gather of chunk j
    // can be waited one chunk later, so that the link never drains while the host works.
    gatherLater_ = rsag_ && (direct_ || L_ == 1);
    myShare_ = shareOwnedBy(host_, local_);
    const bool resultInSlot = L_ > 1 && (!rooted_ || (host_ == rootHost_ && owners_ > 1));
    copyOut_ = resultInSlot;
  }

  Plan build() {
    const int K = static_cast<int>(chunks_);
    if (K == 0) {
      p_.steps.push_back(Step::barrier(Scope::Host));
      return std::move(p_);
    }
    const int64_t regionBytes = regionElems_ * es_;
    // Per chunk parity: my partial, then one region per other host.
    for (int par = 0; par < std::min(K, 2); ++par) scratch_[par] = p_.reserveScratch(regionBytes * H_);
    hop1_.resize(K);
    hop2_.resize(K);
    p_.buffersUsed = K;

    stage(0);
    p_.steps.push_back(Step::barrier(Scope::Host));
    if (gatherLater_) return buildGatheringLater(K);
    for (int j = 0; j < K; ++j) {
      if (j > 0 && L_ > 1) p_.steps.push_back(Step::barrier(Scope::Host));
      partialAndPost(j);
      if (j >= 1) finishReduce(j - 1);
      if (j >= 2) copyOut(j - 2);
      if (j + 1 < K) stage(j + 1);
      if (j >= 1) finishGather(j - 1);
    }
    if (!copyOut_) {
      finishReduce(K - 1);
      finishGather(K - 1);
    } else if (K == 1) {
      finishReduce(0);
      finishGather(0);
      p_.steps.push_back(Step::barrier(Scope::Host));
      copyOut(0);
    } else {
      // Chunk K-1's results go to parity K-1, whose chunk K-3 copies were done before B_K.
      p_.steps.push_back(Step::barrier(Scope::Host));
      copyOut(K - 2);
      finishReduce(K - 1);
      finishGather(K - 1);
      p_.steps.push_back(Step::barrier(Scope::Host));
      copyOut(K - 1);
    }
    if (direct_) p_.steps.push_back(Step::barrier(Scope::Host));
    return std::move(p_);
  }

  // The reduce-scatter pipeline with chunk j's all-gather waited after chunk j+2's transfers are
  // posted (not before chunk j+1's): the link holds the next chunk's pieces while the host waits,
  // where waiting the gather just posted empties the link before each host barrier. Copy-out
  // follows one chunk later too (chunk j after B_(j+3)). Every owner's output of chunk j is
  // final before the barrier that precedes its readers' copy, and inputs are overwritten only
  // after every read of them (chunk j's before B_(j+1)). Messages and their order are those of
  // build(), so a host reading its peers directly and one staging still match.
  Plan buildGatheringLater(int K) {
    for (int j = 0; j < K; ++j) {
      if (j > 0 && L_ > 1) p_.steps.push_back(Step::barrier(Scope::Host));
      partialAndPost(j);
      if (j >= 1) finishReduce(j - 1);
      if (j >= 3) copyOut(j - 3);
      if (j >= 2) finishGather(j - 2);
    }
    finishReduce(K - 1);
    for (int c = std::max(0, K - 2); c < K; ++c) finishGather(c);
    if (copyOut_) {
      p_.steps.push_back(Step::barrier(Scope::Host));
      for (int c = std::max(0, K - 3); c < K; ++c) copyOut(c);
      p_.steps.push_back(Step::barrier(Scope::Host));
    }
    return std::move(p_);
  }

 private:
  // The local index on host h that owns share m (reduces it and holds its result).
  int ownerLocal(int h, int m) const {
    if (rooted_ && owners_ == 1 && h == rootHost_) return hv_.localIndex[req_.root];
    return m;
  }
  int ownerRank(int h, int m) const { return hv_.ranksOf[h][ownerLocal(h, m)]; }
  // The share that local index l of host h owns, or -1.
  int shareOwnedBy(int h, int l) const {
    for (int m = 0; m < owners_; ++m)
      if (ownerLocal(h, m) == l) return m;
    return -1;
  }
  int64_t chunkOff(int j) const { return j * chunkElems_; }
  int64_t chunkLen(int j) const { return std::min(chunkElems_, total_ - chunkOff(j)); }
  std::pair<int64_t, int64_t> share(int j, int m) const { return balancedRange(chunkLen(j), owners_, m); }
  int64_t regionOff(int m) const { return m * regionElems_ * es_; }
  int64_t inOff(int j, int64_t e) const { return (chunkOff(j) + e) * es_; }
  int64_t scratchOf(int j, int slot) const { return scratch_[j & 1] + slot * regionElems_ * es_; }
  int otherIndex(int h) const { return h < host_ ? h + 1 : h; }  // scratch region of host h's partial (1..H-1)

  // My contribution to share m of chunk j, where the host's reduction reads it.
  void stage(int j) {
    if (L_ == 1 || direct_) return;
    for (int m = 0; m < owners_; ++m) {
      if (ownerLocal(host_, m) == local_) continue;
      auto [lo, hi] = share(j, m);
      if (hi > lo)
        p_.steps.push_back(Step::copy(Loc::slot(me_, j, regionOff(m)), Loc::in(0, inOff(j, lo)), (hi - lo) * es_));
    }
  }

  // Where my partial of chunk j lives: my input itself when I am alone on my host.
  Loc partialLoc(int j, int64_t extraElems) const {
    auto [lo, hi] = share(j, myShare_);
    if (L_ == 1) return Loc::in(0, inOff(j, lo + extraElems));
    return Loc::scratch(scratchOf(j, 0) + extraElems * es_);
  }
  Loc receivedLoc(int j, int h) const { return Loc::scratch(scratchOf(j, otherIndex(h))); }
  // Where the final value of my share of chunk j goes.
  Loc resultLoc(int j, int64_t extraElems) const {
    auto [lo, hi] = share(j, myShare_);
    const bool toOut = rooted_ ? me_ == req_.root : L_ == 1 || direct_;
    if (toOut) return Loc::out(0, inOff(j, lo + extraElems));
    return Loc::slot(me_, j, regionOff(myShare_) + extraElems * es_);
  }

  void partialAndPost(int j) {
    if (myShare_ < 0) return;
    auto [lo, hi] = share(j, myShare_);
    const int64_t n = hi - lo;
    if (n == 0) return;
    if (L_ > 1) {
      std::vector<Loc> srcs;
      for (int r : hv_.ranksOf[host_])
        srcs.push_back(r == me_    ? Loc::in(0, inOff(j, lo))
                       : direct_ ? Loc::peerIn(r, 0, inOff(j, lo))
                                 : Loc::slot(r, j, regionOff(myShare_)));
      p_.steps.push_back(Step::reduce(partialLoc(j, 0), srcs, n, false));
    }
    auto& ids = hop1_[j];
    for (int h = 0; h < H_; ++h) {
      if (h == host_) continue;
      const int peer = ownerRank(h, myShare_);
      if (rooted_) {
        if (host_ != rootHost_ && h == rootHost_) ids.push_back(p_.send(peer, partialLoc(j, 0), n * es_));
        if (host_ == rootHost_) ids.push_back(p_.recv(peer, receivedLoc(j, h), n * es_));
      } else if (!rsag_) {
        ids.push_back(p_.send(peer, partialLoc(j, 0), n * es_));
        ids.push_back(p_.recv(peer, receivedLoc(j, h), n * es_));
      } else {
        // Reduce-scatter on the rail: piece h of my share goes to host h, piece host_ of its share comes back.
        auto [slo, shi] = balancedRange(n, H_, h);
        if (shi > slo) ids.push_back(p_.send(peer, partialLoc(j, slo), (shi - slo) * es_));
        auto [mlo, mhi] = balancedRange(n, H_, host_);
        if (mhi > mlo) ids.push_back(p_.recv(peer, receivedLoc(j, h), (mhi - mlo) * es_));
      }
    }
  }

  // Waits for chunk j's partials and reduces them in host order; on a reduce-scatter rail, posts
  // the all-gather of the reduced piece.
  void finishReduce(int j) {
    if (myShare_ < 0) return;
    auto [lo, hi] = share(j, myShare_);
    const int64_t n = hi - lo;
    if (n == 0) return;
    p_.waitAll(hop1_[j]);
    if (rooted_ && host_ != rootHost_) return;
    if (!rsag_) {
      std::vector<Loc> srcs;
      for (int h = 0; h < H_; ++h) srcs.push_back(h == host_ ? partialLoc(j, 0) : receivedLoc(j, h));
      p_.steps.push_back(Step::reduce(resultLoc(j, 0), srcs, n, true));
      return;
    }
    auto [mlo, mhi] = balancedRange(n, H_, host_);
    if (mhi > mlo) {
      std::vector<Loc> srcs;
      for (int h = 0; h < H_; ++h) srcs.push_back(h == host_ ? partialLoc(j, mlo) : receivedLoc(j, h));
      p_.steps.push_back(Step::reduce(resultLoc(j, mlo), srcs, mhi - mlo, true));
    }
    auto& ids = hop2_[j];
    for (int h = 0; h < H_; ++h) {
      if (h == host_) continue;
      const int peer = ownerRank(h, myShare_);
      if (mhi > mlo) ids.push_back(p_.send(peer, resultLoc(j, mlo), (mhi - mlo) * es_));
      auto [slo, shi] = balancedRange(n, H_, h);
      if (shi > slo) ids.push_back(p_.recv(peer, resultLoc(j, slo), (shi - slo) * es_));
    }
  }
  void finishGather(int j) { p_.waitAll(hop2_[j]); }

  void copyOut(int j) {
    if (!copyOut_) return;
    if (rooted_ && me_ != req_.root) return;
    // My own share first, then from the next one on (as on one host: rankFromMe, plan_util.h).
    const int first = myShare_ >= 0 ? myShare_ : local_ % owners_;
    for (int i = 0; i < owners_; ++i) {
      const int m = (first + i) % owners_;
      const int owner = ownerRank(host_, m);
      if ((rooted_ || direct_) && owner == me_) continue;  // already in my output
      auto [lo, hi] = share(j, m);
      const Loc from = direct_ ? Loc::peerOut(owner, 0, inOff(j, lo)) : Loc::slot(owner, j, regionOff(m));
      if (hi > lo) p_.steps.push_back(Step::copy(Loc::out(0, inOff(j, lo)), from, (hi - lo) * es_));
    }
  }

  const PlanRequest& req_;
  const HostView hv_;
  const bool rooted_;
  Plan p_;
  int me_, host_, local_, L_, H_, owners_, myShare_, rootHost_;
  bool rsag_, copyOut_, direct_, gatherLater_;
  int64_t es_, regionElems_, chunkElems_, total_, chunks_;
  int64_t scratch_[2] = {0, 0};
  std::vector<std::vector<int>> hop1_, hop2_;
};

}  // namespace

Plan planReductionAcrossHosts(const PlanRequest& req, bool rails, bool rootOnly, const char* algo) {
  return HostsReduction(req, rails, rootOnly, algo).build();
}

Plan planAllReduceLeaders(const PlanRequest& req) {
  return planReductionAcrossHosts(req, false, false, "allreduce/leaders");
}

Plan planAllReduceRails(const PlanRequest& req) {
  return planReductionAcrossHosts(req, true, false, "allreduce/rails");
}

}  // namespace hoccl
