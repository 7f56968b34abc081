// Which ranks of a group share a host. Every rank publishes its host identity through the
// group's store and reads everyone's, so all ranks derive the same table (never rank // L: ranks
// may be interleaved or hosts uneven).
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace hoccl {

// HOCCL_HOSTNAME when set; else the hostname plus what makes POSIX shared memory and process
// ids reachable: the boot, the /dev/shm instance and the PID and IPC namespaces. Two containers
// on one machine with separate /dev/shm are two hosts.
std::string localHostIdentity();

struct HostTable {
  std::vector<std::string> names;        // per host, in order of its lowest rank
  std::vector<int> hostOf;               // per rank
  std::vector<std::vector<int>> ranksOf; // per host, ascending group ranks
  int hosts() const { return static_cast<int>(names.size()); }

  static HostTable fromIdentities(const std::vector<std::string>& identityOfRank);
  // Collective over the store: every rank of the group must call it once.
  static HostTable exchange(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                            std::chrono::milliseconds timeout);
};

}  // namespace hoccl
