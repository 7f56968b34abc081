// The rail form of all_to_all across hosts (alltoall_forms.h): one host leg hands every block to
// its relay, then each relay sends one aggregated message per destination, and each destination
// scatters what arrives from each remote host into its output. The plan is derived from the split
// matrix alone, so every rank knows every message size without asking.
#include "backend/multihost/legs.h"
#include "backend/multihost/multihost_group.h"

namespace hoccl {

namespace {

at::Tensor pack(const std::vector<at::Tensor>& blocks) {
  if (blocks.empty()) return at::empty({0}, at::kByte);
  return blocks.size() == 1 ? blocks[0].contiguous() : at::cat(blocks);
}

// The remote ranks whose blocks from host `host` the rank `relay` carries, in rank order.
std::vector<int> relayedBy(const HostLayout& layout, int host, int relay) {
  std::vector<int> dsts;
  for (int d = 0; d < static_cast<int>(layout.table.hostOf.size()); ++d)
    if (layout.hostOf(d) != host && relayFor(layout, host, d) == relay) dsts.push_back(d);
  return dsts;
}

}  // namespace

void MultiHostGroup::alltoallRail(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                                  const char* op, const SplitMatrix& m) {
  setAlgorithm("multihost_rail");
  const std::vector<int>& hostRanks = layout_.table.ranksOf[host_];
  const std::vector<int> carried = relayedBy(layout_, host_, rank_);
  const int tag = crossTag();
  std::vector<c10::intrusive_ptr<c10d::Work>> crossing;
  const auto posted = std::chrono::steady_clock::now();

  // What each remote host's relay for this rank will send: that host's blocks for it, in its rank order.
  std::vector<std::pair<int, at::Tensor>> arriving;
  for (int h = 0; h < layout_.hosts(); ++h) {
    if (h == host_) continue;
    int64_t bytes = 0;
    for (int s : layout_.table.ranksOf[h]) bytes += m.at(s, rank_);
    if (bytes == 0) continue;
    arriving.emplace_back(h, at::empty({bytes}, at::kByte));
    crossing.push_back(startTransfer(op, *groups_.global, allRanks_, false, relayFor(layout_, h, rank_),
                                     arriving.back().second, tag));
  }

  // Host leg: to each local rank, this rank's block for it followed by the blocks it relays.
  std::vector<at::Tensor> packs, gathered;
  for (int peer : hostRanks) {
    std::vector<at::Tensor> blocks{ins[peer]};
    for (int d : relayedBy(layout_, host_, peer)) blocks.push_back(ins[d]);
    packs.push_back(pack(blocks));
    int64_t bytes = m.at(peer, rank_);
    for (int d : carried) bytes += m.at(peer, d);
    gathered.push_back(at::empty({bytes}, at::kByte));
  }
  std::vector<at::Tensor> messages;
  try {
    local(op, [&](ProcessGroupHOCCL& g) { return g.alltoall(gathered, packs, c10d::AllToAllOptions()); });
    // One message per carried destination: every local rank's block for it, in local order.
    std::vector<int64_t> offset;
    for (size_t i = 0; i < hostRanks.size(); ++i) offset.push_back(m.at(hostRanks[i], rank_));
    for (int d : carried) {
      std::vector<at::Tensor> blocks;
      for (size_t i = 0; i < hostRanks.size(); ++i) {
        blocks.push_back(gathered[i].narrow(0, offset[i], m.at(hostRanks[i], d)));
        offset[i] += m.at(hostRanks[i], d);
      }
      messages.push_back(pack(blocks));
      if (messages.back().numel() == 0) continue;
      crossing.push_back(startTransfer(op, *groups_.global, allRanks_, true, d, messages.back(), tag));
    }
  } catch (...) {
    legs::drain(crossing, posted + timeout_);  // gloo may still read or write the staging buffers
    throw;
  }
  // Same-host blocks, while the messages cross.
  for (size_t i = 0; i < hostRanks.size(); ++i)
    outs[hostRanks[i]].copy_(gathered[i].narrow(0, 0, m.at(hostRanks[i], rank_)));
  for (auto& w : crossing) waitAcross(op, allRanks_, w);
  for (auto& [h, message] : arriving) {
    int64_t off = 0;
    for (int s : layout_.table.ranksOf[h]) {
      outs[s].copy_(message.narrow(0, off, m.at(s, rank_)));
      off += m.at(s, rank_);
    }
  }
}

}  // namespace hoccl
