#include "common/config.h"

#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace hoccl {
namespace config {

namespace {

using K = Kind;
using R = ReadBy;

const std::vector<Variable> kTable = {
    {"HOCCL_DEBUG", K::Choice, R::Core, "off", "off,INFO,TRACE",
     "INFO: the configuration at group creation, and at shutdown each (op, algorithm, size) with its "
     "count and mean time split into barriers, copies, peer reads, reductions; "
     "TRACE: also one line per op and every plan"},
    {"HOCCL_SHM_SLOT_BYTES", K::Bytes, R::Core, "4M", "",
     "staging slot per rank (two per rank); larger messages run in chunks; at least 4K"},
    {"HOCCL_SHM_RING_BYTES", K::Bytes, R::Core, "auto", "",
     "send/recv ring per ordered pair of ranks; auto: 64 MiB / world^2, clamped to 64 KiB - 1 MiB; at least 4K"},
    {"HOCCL_ALLREDUCE_ONESHOT_BYTES", K::Bytes, R::Core, "64K", "",
     "all_reduce up to this size runs one-shot (every rank reduces everything); above: reduce-scatter + all-gather"},
    {"HOCCL_SHM_CMA", K::Choice, R::Core, "auto", "auto,0,1,off,on",
     "cross-memory (process_vm_readv) reads between ranks: auto (probe), 0 off, 1 required"},
    {"HOCCL_CMA_MIN_BYTES", K::Bytes, R::Core, "256K", "", "payloads from this size use direct-read plans"},
    {"HOCCL_STAGED_ROUND_BYTES", K::Bytes, R::Core, "auto", "",
     "staged plans (below the cross-memory thresholds) move data in rounds of this many bytes per slot; auto: "
     "the whole slot (one round)"},
    {"HOCCL_ALLREDUCE_CMA_MIN_BYTES", K::Bytes, R::Core, "auto", "",
     "all_reduce reads peers directly from this size up (and from HOCCL_CMA_MIN_BYTES); below, it stages; "
     "auto: 4M, or HOCCL_CMA_MIN_BYTES when that is set"},
    {"HOCCL_ALLTOALL_CMA_MIN_BYTES", K::Bytes, R::Core, "auto", "",
     "all_to_all reads peers directly from this per-rank input size up; below, it stages; auto: 16K per "
     "peer block (world x 16K), or HOCCL_CMA_MIN_BYTES when that is set"},
    {"HOCCL_ALLREDUCE_CMA_MAX_BYTES", K::Bytes, R::Core, "auto", "",
     "all_reduce reads peers directly only while tensor bytes x world is below this; auto: 256M, or 64M when "
     "HOCCL_HUGEPAGE_MIN_BYTES=0"},
    {"HOCCL_HUGEPAGE_MIN_BYTES", K::Bytes, R::Core, "4M", "",
     "a reused tensor range of this size that peers read directly goes onto transparent huge pages; 0: off"},
    {"HOCCL_STREAMING_COPY_BYTES", K::Bytes, R::Core, "4M", "",
     "ops whose outputs total at least this many bytes on a rank copy into them with cache-bypassing stores; 0: off"},
    {"HOCCL_SPIN_US", K::Integer, R::Core, "auto", "",
     "microseconds a rank busy-waits at a barrier before yielding its core; auto: 30, or 0 while cores are "
     "shared (HOCCL_WAIT_POLICY); a value set here holds in both cases"},
    {"HOCCL_CALLER_SPIN_US", K::Integer, R::Core, "auto", "",
     "the same for ops that run on the thread of a caller waiting for them (synchronous CPU collectives); "
     "auto: 2000, or 0 while cores are shared; a value set here holds in both cases"},
    {"HOCCL_WAIT_POLICY", K::Choice, R::Core, "auto", "auto,busy,idle",
     "whether ranks treat their cores as shared: auto decides before each op from the job's ranks on this host "
     "(LOCAL_WORLD_SIZE, the default group) against the CPUs a rank may use, and from the machine's runnable "
     "threads (/proc/loadavg, sampled every 50 ms); busy or idle force it. Shared cores: no spin, a short "
     "yield, all_reduce staged in one round (a group agrees from its next op)"},
    {"HOCCL_SHARED_YIELD_US", K::Integer, R::Core, "0", "",
     "while the job's own compute shares the cores, microseconds a waiter yields before it sleeps on a futex (1000 "
     "while only ranks share them, or none)"},
    {"HOCCL_SHARED_SLICE_US", K::Integer, R::Core, "100", "",
     "while cores are shared, the scheduler time slice (Linux 6.12+ sched_setattr) a waiter asks for while it "
     "sleeps, so that its peer's wake-up preempts a compute thread at once; its own slice comes back once "
     "awake; 0: leave the scheduler alone"},
    {"HOCCL_INLINE_BYTES", K::Bytes, R::Core, "64K", "",
     "ops up to this size run on the caller's thread when nothing is queued"},
    {"HOCCL_ALLTOALL_ALGO", K::Choice, R::Core, "varipath", "varipath,direct,pairwise",
     "all_to_all schedule: varipath (topology-aware phases), direct (one phase), pairwise (peer rounds)"},
    {"HOCCL_ALLTOALL_PLAN_CACHE", K::Integer, R::Core, "8", "",
     "VarioPath plans kept per group for the most recent split matrices; 0 plans every call"},
    {"HOCCL_TOPOLOGY", K::Text, R::Python, "flat", "",
     "VarioPath topology: a preset (direct4, gen4-4sw-2skt, gen5-2sw), preset:hosts, a .json file, or auto "
     "(nvidia-smi topo -m)"},
    {"HOCCL_VARIPATH_MODEL", K::Choice, R::Python, "contention", "fluid,contention,dma",
     "the cost model VarioPath's scheduler chooses plans with (see docs/varipath.md)"},
    {"HOCCL_CACHE_DIR", K::Text, R::Python, "~/.cache/hoccl", "", "VarioPath channel-catalog cache"},
    {"HOCCL_HOSTNAME", K::Text, R::Core, "auto", "",
     "host identity of a rank; auto: the hostname plus what makes /dev/shm reachable (boot id, IPC and mount "
     "namespaces), so containers with separate /dev/shm are separate hosts"},
    {"HOCCL_INTER_HOST", K::Choice, R::Python, "gloo", "gloo",
     "engine of the inter-host leg when a group spans hosts: gloo (torch's ProcessGroupGloo; honours "
     "GLOO_SOCKET_IFNAME)"},
    {"HOCCL_LEADER_MAX_BYTES", K::Bytes, R::Core, "64K", "",
     "across hosts, all_reduce up to this size goes through one leader per host (latency); larger ones along "
     "every rail (bandwidth)"},
    {"HOCCL_CHECK_ACROSS_HOSTS", K::Choice, R::Core, "1", "0,1",
     "across hosts, every collective first checks that its arguments agree on every host (one small "
     "message each way per rail peer); 0 skips it: a mismatch then ends a process inside gloo"},
    {"HOCCL_NET_MESSAGE_US", K::Integer, R::Core, "auto", "",
     "across hosts, the network engine's cost per message that all_to_all's cost model uses; auto: measured "
     "when the group is created (the median of eight round trips of an 8-byte message)"},
    {"HOCCL_NET_LINK_MBIT", K::Integer, R::Core, "auto", "",
     "across hosts, one host link's rate each way in Mbit/s that all_to_all's cost model uses; auto: measured "
     "when the group is created (one 4 MiB message beyond a round trip)"},
    {"HOCCL_NET_RELAY_MBYTES", K::Integer, R::Core, "auto", "",
     "across hosts, the rate in MB/s at which all_to_all's relay form moves its bytes inside the hosts "
     "(pack, hand to the relay, scatter), which its cost model weighs against the messages the relay "
     "saves; auto: 1000, fitted on the 2-core VM (docs/multihost.md says why it is not measured)"},
    {"HOCCL_MULTIHOST_ALLTOALL", K::Choice, R::Core, "auto", "auto,direct,rail",
     "across hosts, the form of all_to_all: auto (a cost model picks per call from the split matrix), direct "
     "(every cross-host block point to point) or rail (blocks gathered per rail inside each host, one "
     "message per remote host)"},
    {"HOCCL_CUDA_TRANSPORT", K::Choice, R::Core, "ce", "ce,host",
     "CUDA tensors: ce (copy engines where covered) or host (host staging for every op)"},
    {"HOCCL_CE_PATH", K::Choice, R::Core, "auto", "auto,p2p,host",
     "copy-engine path per pair of ranks: auto, p2p (CUDA IPC + one copy), host (pinned host staging)"},
    {"HOCCL_REDUCE_ON", K::Choice, R::Core, "auto", "auto,gpu,host",
     "where CUDA reductions compute: gpu (bounded kernel) or host; auto: gpu when the kernel is built in"},
    {"HOCCL_REDUCE_CTAS", K::Integer, R::Core, "4", "", "the most CTAs one reduction kernel may use (1-1024)"},
    {"HOCCL_LIBCUDA", K::Text, R::Core, "libcuda.so.1", "", "CUDA driver library to dlopen"},
    {"HOCCL_NVCC_GENCODE", K::Text, R::Build, "sm_90 + compute_90", "",
     "build time: nvcc -gencode flags (space-separated) for the reduction kernel"},
    {"HOCCL_NO_NVCC", K::Text, R::Build, "unset", "", "build time: set to build without the GPU reduction kernel"},
    {"HOCCL_TEST_WORLDS", K::Text, R::Tests, "2", "", "tests: rank counts for the GPU tests, e.g. 2,4"},
    {"HOCCL_GPU_CHECK_SKIP_BUILD", K::Text, R::Tests, "unset", "",
     "scripts/gpu_check.sh: 1 uses the extension already built instead of building it"},
    {"HOCCL_COMMIT", K::Text, R::Tests, "unset", "",
     "scripts/gpu_check.sh only: the commit its log names when the copied tree has no .git"},
    {"HOCCL_STAGE_LIMIT_S", K::Text, R::Tests, "unset", "",
     "set by scripts/gpu_check.sh for each stage: the seconds that stage may run"},
    {"HOCCL_AS_GLOO", K::Text, R::Tests, "unset", "",
     "conformance suite: 1 runs torch's distributed_test.py under the name gloo on hoccl groups"},
};

std::string raw(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? std::string(v) : std::string();
}

[[noreturn]] void reject(const Variable& var, const std::string& value, const std::string& why) {
  throw std::invalid_argument(std::string("hoccl: ") + var.name + "=" + value + " " + why);
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

int64_t parseNumber(const Variable& var, const std::string& value, bool allowSuffix) {
  char* end = nullptr;
  double x = std::strtod(value.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  int64_t mult = 1;
  if (allowSuffix && (unit == "K" || unit == "KB" || unit == "k")) mult = 1 << 10;
  else if (allowSuffix && (unit == "M" || unit == "MB" || unit == "m")) mult = 1 << 20;
  else if (allowSuffix && (unit == "G" || unit == "GB" || unit == "g")) mult = 1 << 30;
  else if (!unit.empty() || end == value.c_str())
    reject(var, value, allowSuffix ? "is not a byte count (use bytes, or a K/M/G suffix)" : "is not an integer");
  if (!allowSuffix && static_cast<double>(static_cast<int64_t>(x)) != x) reject(var, value, "is not an integer");
  return static_cast<int64_t>(x * mult);
}

int64_t number(const std::string& name, int64_t autoValue, int64_t minimum, bool allowSuffix) {
  const Variable& var = variable(name);
  std::string value = text(name);
  if (value == "auto") return autoValue;  // the caller's own value may be a sentinel below the minimum
  int64_t n = parseNumber(var, value, allowSuffix);
  if (n < minimum) reject(var, value, "is below the smallest allowed value, " + std::to_string(minimum));
  return n;
}

}  // namespace

const std::vector<Variable>& table() { return kTable; }

const Variable& variable(const std::string& name) {
  for (const Variable& v : kTable)
    if (name == v.name) return v;
  throw std::logic_error("hoccl: " + name + " is not in the configuration table");
}

bool isSet(const std::string& name) { return !raw(name).empty(); }

std::string text(const std::string& name) {
  const Variable& var = variable(name);
  std::string value = raw(name);
  if (value.empty()) return var.defaultValue;
  if (var.kind == Kind::Choice) {
    for (const std::string& c : split(var.choices))
      if (value == c) return value;
    reject(var, value, std::string("is not one of ") + var.choices);
  }
  return value;
}

int64_t bytes(const std::string& name, int64_t autoValue, int64_t minimum) {
  return number(name, autoValue, minimum, true);
}

int64_t integer(const std::string& name, int64_t autoValue, int64_t minimum) {
  return number(name, autoValue, minimum, false);
}

std::vector<std::string> unknownVariables() {
  std::set<std::string> known;
  for (const Variable& v : kTable) known.insert(v.name);
  std::vector<std::string> unknown;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("HOCCL_", 0) == 0 && !known.count(name)) unknown.push_back(name);
  }
  return unknown;
}

void validateAll() {
  for (const Variable& v : kTable) {
    if (v.readBy != ReadBy::Core || !isSet(v.name)) continue;
    if (v.kind == Kind::Bytes) bytes(v.name, 0, INT64_MIN);
    else if (v.kind == Kind::Integer) integer(v.name, 0, INT64_MIN);
    else text(v.name);
  }
}

std::string describe() {
  std::ostringstream out;
  for (const Variable& v : kTable) {
    if (v.readBy == ReadBy::Build || v.readBy == ReadBy::Tests) continue;
    out << "  " << v.name << "=" << text(v.name) << (isSet(v.name) ? "  (from the environment)" : "") << "\n";
  }
  for (const std::string& name : unknownVariables()) out << "  " << name << ": unknown to hoccl, ignored\n";
  return out.str();
}

}  // namespace config
}  // namespace hoccl
