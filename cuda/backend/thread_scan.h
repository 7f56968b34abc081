// Which threads of this process are runnable now, from /proc/self/task: what core_sharing.h asks
// to tell the job's own compute from the ranks' waits.
#pragma once

namespace hoccl {

// Threads scanned at most: beyond, a scan would cost more than the decision is worth.
constexpr int kMaxScannedThreads = 256;

// Threads of this process other than the caller that are runnable now (state R in
// /proc/self/task/<tid>/stat): the model's compute threads, DDP's backward, torch's intra-op pool
// at work. Taken at the start of an op, it says what would take the core a wait yields: hoccl's
// own threads sleep then (the worker while the caller runs the op, the caller in wait()), and a
// caller that computes between ops is not counted, its compute is serialized with the op.
// Counts up to `enough` (the wait policy needs one), the thread found last time first. -1:
// unreadable, or more than kMaxScannedThreads threads. Thread-safe.
int otherRunnableThreadsInProcess(int enough = 1 << 30);

// The state letter of a /proc/<pid>/stat line ("tid (comm) S ..."), '?' if malformed. comm is
// whatever the thread named itself, parentheses and spaces included: the state follows the last ')'.
char taskStateOf(const char* statLine);

}  // namespace hoccl
