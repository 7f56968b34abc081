#include "backend/host_table.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "common/config.h"

namespace hoccl {

namespace {

std::string firstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespaceId(const char* which) {
  struct stat st {};
  std::string path = std::string("/proc/self/ns/") + which;
  return stat(path.c_str(), &st) == 0 ? std::to_string(st.st_ino) : "?";
}

std::string shmInstance() {
  struct stat st {};
  return stat("/dev/shm", &st) == 0 ? std::to_string(st.st_dev) : "?";
}

}  // namespace

std::string localHostIdentity() {
  if (config::isSet("HOCCL_HOSTNAME")) return config::text("HOCCL_HOSTNAME");
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::ostringstream id;
  id << name << "/boot=" << firstLine("/proc/sys/kernel/random/boot_id") << "/shm=" << shmInstance()
     << "/pidns=" << namespaceId("pid") << "/ipcns=" << namespaceId("ipc");
  return id.str();
}

HostTable HostTable::fromIdentities(const std::vector<std::string>& identityOfRank) {
  HostTable t;
  std::map<std::string, int> index;
  for (size_t r = 0; r < identityOfRank.size(); ++r) {
    auto it = index.find(identityOfRank[r]);
    if (it == index.end()) {
      it = index.emplace(identityOfRank[r], t.hosts()).first;
      t.names.push_back(identityOfRank[r]);
      t.ranksOf.emplace_back();
    }
    t.hostOf.push_back(it->second);
    t.ranksOf[it->second].push_back(static_cast<int>(r));
  }
  return t;
}

HostTable HostTable::exchange(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                              std::chrono::milliseconds timeout) {
  const std::string mine = localHostIdentity();
  store->set("hoccl/host/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> ids(size);
  for (int r = 0; r < size; ++r) {
    std::string key = "hoccl/host/" + std::to_string(r);
    store->wait({key}, timeout);
    auto v = store->get(key);
    ids[r].assign(v.begin(), v.end());
  }
  return fromIdentities(ids);
}

}  // namespace hoccl
