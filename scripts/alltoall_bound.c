/* What world-2 all_to_all costs on this machine with nothing but its data movement and two
 * synchronizations: the lower bound of hoccl's direct-read plan (and of Open MPI's pairwise
 * exchange over cross-memory reads), with no torch, no Python and no validation.
 *
 *   gcc -O2 scripts/alltoall_bound.c -o /tmp/alltoall_bound && /tmp/alltoall_bound 1048576 2000
 *
 * Two processes (fork) each own an input and an output of BYTES. Per call, as hoccl's plan does:
 * a barrier (peers' buffers are ready), copy the own half of the input to the output (memcpy),
 * read the peer's half for this rank with one process_vm_readv, a barrier (the peer is done
 * reading). Barriers spin on a word in shared memory. Prints rank 0's time per call, and for
 * reference each half of the work alone. Needs ptrace access between the two processes, as
 * hoccl's direct reads do (same user, Yama ptrace_scope 0 or 1 for a parent and its child).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
  _Atomic unsigned arrived[2];
  long input[2]; /* each rank's input address, in its own address space */
  int pid[2];
};

static struct shared *sh;
static int rank;
static unsigned barriers;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void barrier(void) {
  ++barriers;
  atomic_store(&sh->arrived[rank], barriers);
  while (atomic_load(&sh->arrived[1 - rank]) < barriers) __builtin_ia32_pause();
}

static void read_peer(void *dst, long remote, size_t n) {
  struct iovec local = {dst, n}, peer = {(void *)remote, n};
  if (process_vm_readv(sh->pid[1 - rank], &local, 1, &peer, 1, 0) != (ssize_t)n) {
    perror("process_vm_readv");
    exit(1);
  }
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum work { WHOLE, OWN_COPY_ONLY, PEER_READ_ONLY };

static void measure(enum work w, const char *name, char *in, char *out, size_t bytes, int calls) {
  const size_t half = bytes / 2;
  const long peer_in = sh->input[1 - rank];
  double *t = malloc(sizeof(double) * calls), sum = 0;
  for (int i = -calls / 10; i < calls; ++i) { /* the first tenth warms up */
    barrier();
    double t0 = now_us();
    if (w != PEER_READ_ONLY) memcpy(out + rank * half, in + rank * half, half);
    if (w != OWN_COPY_ONLY) read_peer(out + (1 - rank) * half, peer_in + rank * half, half);
    barrier();
    if (i >= 0) sum += t[i] = now_us() - t0;
  }
  qsort(t, calls, sizeof(double), by_value);
  if (rank == 0)
    printf("%-16s %9zu bytes: mean %7.1f  p10 %7.1f  p50 %7.1f us per call\n", name, bytes, sum / calls,
           t[calls / 10], t[calls / 2]);
  free(t);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s BYTES CALLS\n", argv[0]);
    return 2;
  }
  const size_t bytes = strtoul(argv[1], NULL, 0) & ~(size_t)127;
  const int calls = atoi(argv[2]);
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  rank = fork() == 0;
  char *in, *out;
  if (posix_memalign((void **)&in, 64, bytes) || posix_memalign((void **)&out, 64, bytes)) return 1;
  memset(in, rank + 1, bytes);
  memset(out, 0, bytes);
  sh->input[rank] = (long)in;
  sh->pid[rank] = getpid();
  barrier();
  for (int round = 0; round < 3; ++round) {
    measure(WHOLE, "all_to_all", in, out, bytes, calls);
    measure(OWN_COPY_ONLY, "own half only", in, out, bytes, calls);
    measure(PEER_READ_ONLY, "peer half only", in, out, bytes, calls);
  }
  if (rank == 0) wait(NULL);
  return 0;
}
