/* What a compute thread beside each rank costs an all_reduce that does nothing but its data
 * movement and its two synchronizations: the floor under `bench --busy`'s "busy / idle" column,
 * with no torch, no Python and no hoccl.
 *
 *   gcc -O3 -march=native -pthread scripts/busy_floor.c -o /tmp/busy_floor && /tmp/busy_floor 2 && /tmp/busy_floor 4
 *
 * WORLD processes (fork) run hoccl's one-round reduce-scatter + all-gather over shared memory,
 * float32, per call: copy the input into the rank's slot, barrier, sum the rank's 1/WORLD of
 * every slot into the reduced area, barrier, copy every rank's reduced part to the output. Slots
 * alternate between calls, so two barriers a call suffice, as in hoccl's plan. A barrier is a
 * counter and a generation word; a waiter spins for the wait's spin time, then sleeps on the
 * generation with a futex, as hoccl's waits do (idle with a core per rank: 2 ms spin; busy, or
 * more ranks than cores: no spin, since a spinning rank holds the core a descheduled peer needs).
 *
 * Each size runs idle (nothing else in the job) and busy (one thread beside each rank running
 * a floating-point loop forever, started before the calls), alternating, twice. Per call the
 * time at the slowest rank; prints mean, median and p99 of both, and busy / idle of the mean and
 * of the median. Nothing here can be faster than the scheduler lets a rank run, so where this
 * model's busy / idle exceeds a target, no implementation on this machine meets it.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORLD 8
#define MAX_CALLS 20000

struct barrier {
  _Atomic unsigned arrived;
  _Atomic unsigned generation;
};

struct shared {
  struct barrier bar;
  double call_us[MAX_WORLD][MAX_CALLS]; /* each rank's time per call */
};

static struct shared *sh;
static float *slots[2];   /* [world][elements]: every rank's input, per parity */
static float *reduced[2]; /* [elements]: the reduced parts, per parity */
static int world, rank_;
static double spin_us;
static _Atomic int compute_stop;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void futex(_Atomic unsigned *word, int op, unsigned value) {
  syscall(SYS_futex, (unsigned *)word, op, value, NULL, NULL, 0);
}

static void barrier_wait(void) {
  struct barrier *b = &sh->bar;
  unsigned gen = atomic_load(&b->generation);
  if (atomic_fetch_add(&b->arrived, 1) + 1 == (unsigned)world) {
    atomic_store(&b->arrived, 0);
    atomic_fetch_add(&b->generation, 1);
    futex(&b->generation, FUTEX_WAKE, MAX_WORLD);
    return;
  }
  const double until = now_us() + spin_us;
  while (atomic_load(&b->generation) == gen) {
    if (now_us() < until) continue;
    futex(&b->generation, FUTEX_WAIT, gen);
  }
}

static void *compute(void *arg) {
  (void)arg;
  volatile double x = 1.0;
  while (!atomic_load(&compute_stop))
    for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
  return NULL;
}

static void one_call(int call, const float *in, float *out, size_t n) {
  const int p = call & 1;
  const size_t part = n / world, lo = rank_ * part;
  memcpy(slots[p] + (size_t)rank_ * n, in, n * sizeof(float));
  barrier_wait();
  float *sum = reduced[p] + lo;
  memcpy(sum, slots[p] + lo, part * sizeof(float));
  for (int r = 1; r < world; ++r) {
    const float *from = slots[p] + (size_t)r * n + lo;
    for (size_t i = 0; i < part; ++i) sum[i] += from[i];
  }
  barrier_wait();
  for (int k = 0; k < world; ++k) {
    const size_t from = ((rank_ + k) % world) * part;
    memcpy(out + from, reduced[p] + from, part * sizeof(float));
  }
}

static void rank_main(size_t n, int calls, int busy) {
  float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) in[i] = (float)(rank_ + 1);
  pthread_t t;
  if (busy) pthread_create(&t, NULL, compute, NULL);
  spin_us = busy || world > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 2000;
  barrier_wait();
  for (int c = 0; c < calls; ++c) {
    const double t0 = now_us();
    one_call(c, in, out, n);
    sh->call_us[rank_][c] = now_us() - t0;
  }
  const float want = world * (world + 1) / 2.0f;
  for (size_t i = 0; i < n; ++i)
    if (out[i] != want) {
      fprintf(stderr, "rank %d: element %zu is %f, want %f\n", rank_, i, out[i], want);
      _exit(1);
    }
  atomic_store(&compute_stop, 1);
  if (busy) pthread_join(t, NULL);
  _exit(0);
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

struct stats {
  double mean, median, p99;
};

static struct stats run(size_t bytes, int calls, int busy) {
  const size_t n = bytes / sizeof(float);
  memset(&sh->bar, 0, sizeof sh->bar);
  for (int r = 0; r < world; ++r) {
    if (fork() == 0) {
      rank_ = r;
      rank_main(n, calls, busy);
    }
  }
  int failed = 0;
  for (int r = 0; r < world; ++r) {
    int status;
    wait(&status);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  if (failed) exit(1);
  static double slowest[MAX_CALLS];
  double sum = 0;
  for (int c = 0; c < calls; ++c) {
    slowest[c] = 0;
    for (int r = 0; r < world; ++r)
      if (sh->call_us[r][c] > slowest[c]) slowest[c] = sh->call_us[r][c];
    sum += slowest[c];
  }
  qsort(slowest, calls, sizeof(double), by_value);
  return (struct stats){sum / calls, slowest[calls / 2], slowest[calls * 99 / 100]};
}

int main(int argc, char **argv) {
  world = argc > 1 ? atoi(argv[1]) : 2;
  if (world < 2 || world > MAX_WORLD) {
    fprintf(stderr, "usage: %s WORLD (2..%d)\n", argv[0], MAX_WORLD);
    return 2;
  }
  const size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20};
  const int calls[] = {5000, 3000, 600, 200};
  const size_t biggest = 4 << 20;
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  for (int p = 0; p < 2; ++p) {
    slots[p] = mmap(NULL, biggest * world, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    reduced[p] = mmap(NULL, biggest, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  printf("world %d, %ld CPUs; us per call at the slowest rank: mean / median / p99\n", world,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("%8s | %-26s | %-26s | %s\n", "bytes", "idle", "busy", "busy/idle mean, median");
  for (int s = 0; s < 4; ++s) {
    for (int rep = 0; rep < 2; ++rep) {
      struct stats idle = run(sizes[s], calls[s], 0), busy = run(sizes[s], calls[s], 1);
      printf("%8zu | %7.1f / %7.1f / %7.1f | %7.1f / %7.1f / %7.1f | %5.2fx, %5.2fx\n", sizes[s], idle.mean,
             idle.median, idle.p99, busy.mean, busy.median, busy.p99, busy.mean / idle.mean,
             busy.median / idle.median);
      fflush(stdout);
    }
  }
  return 0;
}
