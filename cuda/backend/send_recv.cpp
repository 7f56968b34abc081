#include "backend/multihost/host_span.h"
#include "backend/process_group.h"
#include "backend/tensor_args.h"

namespace hoccl {

void ProcessGroupHOCCL::ensureP2P() {
  std::lock_guard<std::mutex> lock(p2pMutex_);
  if (p2p_) return;
  const bool acrossHosts = hostsCtx_ && hostsCtx_->pointToPointTimeout.count() > 0;
  p2p_ = std::make_unique<P2PEngine>(*group_, acrossHosts ? hostsCtx_->pointToPointTimeout : timeout_);
  p2p_->setRankNames(groupRankOf_);  // errors and source ranks name this group's ranks
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::postP2P(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                          bool send, std::shared_ptr<AnySourceClaim> claim) {
  const char* op = send ? "send" : "recv";
  TORCH_CHECK(tensors.size() == 1, "hoccl ", op, " on rank ", rank_, ": expects one tensor");
  TORCH_CHECK(peer == -1 || (peer >= 0 && peer < size_ && peer != rank_), "hoccl ", op, " on rank ", rank_,
              ": invalid peer rank ", peer, " (group of ", size_, ")");
  // The engine moves messages between the ranks that share this host's memory.
  const int onHost = peer < 0 ? -1 : localIndexOf(peer);
  TORCH_CHECK(peer < 0 || onHost >= 0, "hoccl ", op, " on rank ", rank_, ": rank ", peer,
              " is on another host (its messages cross the network, not this host's memory)");
  const at::Tensor& user = tensors[0];
  const bool cuda = user.defined() && user.is_cuda();
  if (!cuda) checkTensor(user, op, rank_);
  ensureP2P();
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, send ? c10d::OpType::SEND : c10d::OpType::RECV, tensors);
  // A claimed recv completes only if this engine wins its message: the caller tracks the work
  // that completes either way.
  if (!claim) queue_.track(work);
  // CUDA tensors travel through a pinned host mirror: D2H before a send (ordered after the
  // caller's stream), H2D on the comm stream after a recv.
  at::Tensor host = cuda ? cudaHostMirror(user, send) : at::Tensor();
  auto staged = std::make_shared<Staged>(cuda ? host : user);
  std::optional<c10::Stream> comm;
  if (cuda) {
    comm = commStream(user.device());
    work->setCommStream(*comm);
  }
  auto done = [work, staged, cuda, user, comm, send](std::exception_ptr e, int src) {
    if (!e) {
      try {
        staged->writeBack();
        if (cuda && !send) finishCudaRecv(user, staged->user, *comm, *work);
      } catch (...) {
        e = std::current_exception();
      }
    }
    work->complete(e, src);
  };
  if (send) p2p_->postSend(onHost, tag, ptr(staged->work), nbytes(staged->work), done);
  else p2p_->postRecv(onHost, tag, ptr(staged->work), nbytes(staged->work), done, std::move(claim));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  if (span_) return span_->send(tensors, dst, tag);
  return postP2P(tensors, dst, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (span_) return span_->recv(tensors, src, tag);
  return postP2P(tensors, src, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  if (span_) return span_->recvAnysource(tensors, tag);
  return postP2P(tensors, -1, tag, false);
}

}  // namespace hoccl
