// Where a group's collectives spent their time, summed per (op, algorithm, bytes): what
// HOCCL_DEBUG=INFO prints when the group shuts down. Per-op lines would perturb what they
// measure (the print delays this rank, so its peers' barriers wait longer), a summary does not.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "exec/executor.h"

namespace hoccl {

class OpProfile {
 public:
  void record(const std::string& op, const std::string& algo, int64_t bytes, double totalUs, const PhaseTimes& t);
  // One line per (op, algorithm, bytes): count and mean microseconds per phase; empty if none ran.
  std::string report(int rank) const;

 private:
  struct Sum {
    uint64_t count = 0;
    double totalUs = 0;
    PhaseTimes phases;
  };
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string, int64_t>, Sum> sums_;
};

}  // namespace hoccl
