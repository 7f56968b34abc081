#include "backend/thread_scan.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace hoccl {

char taskStateOf(const char* statLine) {
  const char* paren = std::strrchr(statLine, ')');
  if (!paren || paren[1] != ' ' || paren[2] == '\0') return '?';
  return paren[2];
}

namespace {

int openStat(long tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
  return open(path, O_RDONLY | O_CLOEXEC);
}

// Each thread's stat file stays open between scans: a pread from offset 0 regenerates it (~3 us
// on a VM, against ~8 us to open, read and close it).
class TaskStatFiles {
 public:
  ~TaskStatFiles() {
    for (const Task& t : tasks_) closeIfOpen(t.fd);
  }

  // The directory's threads now, sorted by tid; false if unreadable or too many to scan.
  bool refresh() {
    DIR* dir = opendir("/proc/self/task");
    if (!dir) return false;
    std::vector<long> tids;
    while (dirent* e = readdir(dir))
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(std::strtol(e->d_name, nullptr, 10));
    closedir(dir);
    if (tids.size() > static_cast<size_t>(kMaxScannedThreads)) return false;
    std::sort(tids.begin(), tids.end());
    std::vector<Task> kept;
    kept.reserve(tids.size());
    size_t old = 0;
    for (long tid : tids) {
      while (old < tasks_.size() && tasks_[old].tid < tid) closeIfOpen(tasks_[old++].fd);
      if (old < tasks_.size() && tasks_[old].tid == tid) {
        kept.push_back(tasks_[old++]);
      } else if (const int fd = openStat(tid); fd >= 0) {
        kept.push_back({tid, fd});
      }
    }
    while (old < tasks_.size()) closeIfOpen(tasks_[old++].fd);
    tasks_.swap(kept);
    return true;
  }

  char stateOf(size_t i) {
    Task& t = tasks_[i];
    char buf[512];
    ssize_t n = t.fd >= 0 ? pread(t.fd, buf, sizeof(buf) - 1, 0) : -1;
    if (n <= 0) {  // the tid may have gone to a new thread since the file was opened
      closeIfOpen(t.fd);
      t.fd = openStat(t.tid);
      n = t.fd >= 0 ? pread(t.fd, buf, sizeof(buf) - 1, 0) : -1;
    }
    if (n <= 0) return '?';
    buf[n] = '\0';
    return taskStateOf(buf);
  }

  size_t size() const { return tasks_.size(); }
  long tid(size_t i) const { return tasks_[i].tid; }

 private:
  struct Task {
    long tid;
    int fd;  // -1 when it could not be opened again
  };
  static void closeIfOpen(int fd) {
    if (fd >= 0) close(fd);
  }
  std::vector<Task> tasks_;
};

}  // namespace

int otherRunnableThreadsInProcess(int enough) {
  static std::mutex mutex;
  static TaskStatFiles files;
  static long lastRunnable = -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (!files.refresh()) return -1;
  const long self = syscall(SYS_gettid);
  // A compute thread stays runnable: the one found last time, read first, usually settles it.
  std::vector<size_t> order;
  order.reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (files.tid(i) == lastRunnable && files.tid(i) != self)
      order.insert(order.begin(), i);
    else if (files.tid(i) != self)
      order.push_back(i);
  }
  int runnable = 0;
  for (size_t i : order) {
    if (files.stateOf(i) != 'R') continue;
    lastRunnable = files.tid(i);
    if (++runnable >= enough) break;
  }
  return runnable;
}

}  // namespace hoccl
