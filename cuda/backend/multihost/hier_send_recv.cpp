// Point-to-point in a group spanning hosts: every send and recv goes through the group's own
// gloo group for point-to-point, whichever host the peer is on, so that a recv from any source
// matches senders on every host and messages between a pair keep their order. (Same-host pairs
// pay a loopback TCP hop; collectives are unaffected.) Messages are framed with a header so that
// a recv checks the sender's size before any byte lands (transport/net/gloo/framed_p2p.h). A CUDA
// tensor travels through a pinned host mirror (cuda_via_host.cpp).
#include "backend/multihost/multihost_group.h"
#include "backend/tensor_args.h"

namespace hoccl {

namespace {

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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  checkArgs(tensors, tag, rank_, "send");
  checkPeer(dst, rank_, size_, "send");
  checkUsable("send");
  if (auto w = p2pViaHost(true, tensors[0], dst, tag)) return tracked(*w);
  return tracked(framed_->send(tensors[0], dst, tag));
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkArgs(tensors, tag, rank_, "recv");
  checkPeer(src, rank_, size_, "recv");
  checkUsable("recv");
  if (auto w = p2pViaHost(false, tensors[0], src, tag)) return tracked(*w);
  return tracked(framed_->recv(tensors[0], src, tag));
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkArgs(tensors, tag, rank_, "recv");
  checkUsable("recv");
  if (auto w = p2pViaHost(false, tensors[0], -1, tag)) return tracked(*w);
  return tracked(framed_->recv(tensors[0], -1, tag));
}

}  // namespace hoccl
