// Point-to-point in a group spanning hosts: a pair on one host goes through the host's group
// (its shared-memory rings, as on a single host), a pair on two hosts through the group's own
// gloo group for point-to-point, framed with a header so that a recv checks the sender's size
// before any byte lands (transport/net/gloo/framed_p2p.h). Each pair's messages thus travel on
// one engine and keep their order. A recv from any source is posted on both, with one claim
// (common/any_source_claim.h): whichever engine has a message first receives, the other
// withdraws. A CUDA tensor travels through a pinned host mirror (the host's group's own, or
// cuda_via_host.cpp across hosts).
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"

namespace hoccl {

namespace {

// The recv from any source: done when the engine that took the claim is done with it.
class AnySourceWork : public c10d::Work {
 public:
  using Owner = AnySourceClaim::Owner;
  AnySourceWork(int rank, int tag, at::Tensor user, std::shared_ptr<AnySourceClaim> claim,
                c10::intrusive_ptr<c10d::Work> onHost, c10::intrusive_ptr<c10d::Work> acrossHosts,
                std::chrono::milliseconds timeout)
      : c10d::Work(rank, c10d::OpType::RECVANYSOURCE),
        tag_(tag),
        user_(std::move(user)),
        claim_(std::move(claim)),
        onHost_(std::move(onHost)),
        acrossHosts_(std::move(acrossHosts)),
        timeout_(timeout) {}

  bool isCompleted() override {
    auto* w = winner(claim_->owner());
    return w && w->isCompleted();
  }
  int sourceRank() const override {
    auto* w = winner(claim_->owner());
    return w ? w->sourceRank() : -1;
  }
  std::vector<at::Tensor> result() override { return {user_}; }

  bool wait(std::chrono::milliseconds timeout) override {
    const auto budget = timeout == kNoTimeout ? timeout_ : timeout;
    Owner owner = claim_->waitTaken(std::chrono::steady_clock::now() + budget);
    if (owner == Owner::None && claim_->take(Owner::TimedOut)) owner = Owner::TimedOut;
    if (owner == Owner::None) owner = claim_->owner();  // taken just now by an engine
    TORCH_CHECK_WITH(DistBackendError, owner != Owner::TimedOut, "hoccl recv on rank ", rank_,
                     ": no message from any rank with tag ", tag_, " within the timeout of ", budget.count(), " ms");
    return winner(owner)->wait(budget);
  }

 private:
  c10d::Work* winner(Owner owner) const {
    if (owner == Owner::SharedMemory) return onHost_.get();
    if (owner == Owner::Network) return acrossHosts_.get();
    return nullptr;
  }

  int tag_;
  at::Tensor user_;
  std::shared_ptr<AnySourceClaim> claim_;
  c10::intrusive_ptr<c10d::Work> onHost_, acrossHosts_;
  std::chrono::milliseconds timeout_;
};

void checkArgs(const std::vector<at::Tensor>& tensors, int tag, int rank, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "hoccl ", op, " on rank ", rank, ": expects one tensor");
  const at::Tensor& t = tensors[0];
  if (t.defined() && t.is_cuda()) {
    TORCH_CHECK(!t.is_sparse(), "hoccl ", op, " on rank ", rank, ": sparse tensors are not supported");
  } else {
    checkTensor(t, op, rank);
  }
  TORCH_CHECK(tag >= 0, "hoccl ", op, " on rank ", rank, ": tag ", tag, " is negative");
}

void checkPeer(int peer, int rank, int size, const char* op) {
  TORCH_CHECK(peer >= 0 && peer < size, "hoccl ", op, " on rank ", rank, ": peer ", peer,
              " is outside the group of ", size, " ranks");
  TORCH_CHECK(peer != rank, "hoccl ", op, " on rank ", rank, ": a rank cannot ", op, " to itself");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> HostSpan::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  checkArgs(tensors, tag, rank_, "send");
  checkPeer(dst, rank_, size_, "send");
  checkUsable("send");
  if (layout_.hostOf(dst) == host_) return pg_.postP2P(tensors, dst, tag, true);
  if (auto w = p2pViaHost(true, tensors[0], dst, tag)) return tracked(*w);
  return tracked(framed_->send(tensors[0], dst, tag));
}

c10::intrusive_ptr<c10d::Work> HostSpan::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkArgs(tensors, tag, rank_, "recv");
  checkPeer(src, rank_, size_, "recv");
  checkUsable("recv");
  if (layout_.hostOf(src) == host_) return pg_.postP2P(tensors, src, tag, false);
  if (auto w = p2pViaHost(false, tensors[0], src, tag)) return tracked(*w);
  return tracked(framed_->recv(tensors[0], src, tag));
}

c10::intrusive_ptr<c10d::Work> HostSpan::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkArgs(tensors, tag, rank_, "recv");
  checkUsable("recv");
  if (auto w = p2pViaHost(false, tensors[0], -1, tag)) return tracked(*w);
  return tracked(anySource(tensors[0], tag));
}

c10::intrusive_ptr<c10d::Work> HostSpan::anySource(const at::Tensor& t, int tag) {
  if (layout_.localSize(host_) == 1) return framed_->recv(t, -1, tag);
  auto claim = std::make_shared<AnySourceClaim>();
  // The network's recv first: it registers how it withdraws before shared memory can win.
  auto acrossHosts = framed_->recv(t, -1, tag, claim);
  std::vector<at::Tensor> one{t};
  auto onHost = pg_.postP2P(one, -1, tag, false, claim);
  return c10::make_intrusive<AnySourceWork>(rank_, tag, t, claim, onHost, acrossHosts, timeout_);
}

}  // namespace hoccl
