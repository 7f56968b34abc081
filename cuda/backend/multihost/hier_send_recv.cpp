// Point-to-point in a group spanning hosts: every send and recv goes through the group's own
// gloo group for point-to-point, whichever host the peer is on, so that a recv from any source
// matches senders on every host and messages between a pair keep their order. (Same-host pairs
// pay a loopback TCP hop; collectives are unaffected.)
#include "backend/multihost/legs.h"
#include "backend/multihost/multihost_group.h"
#include "backend/tensor_args.h"

namespace hoccl {

void checkMultiHostTensor(const at::Tensor& t, const char* op, int rank);

namespace {

// A recv into a non-contiguous tensor lands in a contiguous buffer first.
class CopyBackWork : public c10d::Work {
 public:
  CopyBackWork(c10::intrusive_ptr<c10d::Work> inner, at::Tensor user, at::Tensor buffer)
      : inner_(std::move(inner)), user_(std::move(user)), buffer_(std::move(buffer)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    user_.copy_(buffer_);
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor user_, buffer_;
};

void checkPeer(int peer, int rank, int size, const char* op) {
  TORCH_CHECK(peer >= 0 && peer < size, "hoccl ", op, " on rank ", rank, ": peer ", peer,
              " is outside the group of ", size, " ranks");
  TORCH_CHECK(peer != rank, "hoccl ", op, " on rank ", rank, ": a rank cannot ", op, " to itself");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> MultiHostGroup::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  TORCH_CHECK(tensors.size() == 1, "hoccl send on rank ", rank_, ": expects one tensor");
  checkMultiHostTensor(tensors[0], "send", rank_);
  checkPeer(dst, rank_, size_, "send");
  checkUsable("send");
  std::vector<at::Tensor> v{legs::bytesOf(tensors[0].contiguous())};
  return groups_.p2p->send(v, dst, tag);
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  TORCH_CHECK(tensors.size() == 1, "hoccl recv on rank ", rank_, ": expects one tensor");
  checkMultiHostTensor(tensors[0], "recv", rank_);
  checkPeer(src, rank_, size_, "recv");
  checkUsable("recv");
  const at::Tensor& user = tensors[0];
  at::Tensor buffer = user.is_contiguous() ? user : at::empty_like(user, at::MemoryFormat::Contiguous);
  std::vector<at::Tensor> v{legs::bytesOf(buffer)};
  auto work = groups_.p2p->recv(v, src, tag);
  if (buffer.is_same(user)) return work;
  return c10::make_intrusive<CopyBackWork>(work, user, buffer);
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK(tensors.size() == 1, "hoccl recv on rank ", rank_, ": expects one tensor");
  checkMultiHostTensor(tensors[0], "recv", rank_);
  checkUsable("recv");
  const at::Tensor& user = tensors[0];
  at::Tensor buffer = user.is_contiguous() ? user : at::empty_like(user, at::MemoryFormat::Contiguous);
  std::vector<at::Tensor> v{legs::bytesOf(buffer)};
  auto work = groups_.p2p->recvAnysource(v, tag);
  if (buffer.is_same(user)) return work;
  return c10::make_intrusive<CopyBackWork>(work, user, buffer);
}

}  // namespace hoccl
