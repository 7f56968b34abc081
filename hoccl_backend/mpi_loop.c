/* Open MPI's side of `python -m hoccl_backend.bench --vs mpi`: an osu-style timing loop over
 * malloc'ed float32 buffers reused between calls.
 *
 *   mpirun -np W mpi_loop CTL_DIR
 *
 * The benchmark drives the ranks round by round, taking turns with hoccl's ranks. Each rank reads
 * its commands from the FIFO CTL_DIR/cmd.<rank>: an idle rank then sleeps in read() rather than
 * polling inside an MPI call (Open MPI's blocking calls busy-wait), so it takes no CPU from hoccl's
 * turn. Rank 0 answers on the FIFO CTL_DIR/result. Commands, one line each:
 *
 *   cell OP COUNT WARMUP  allocate OP's buffers for COUNT floats (the benchmark's "bytes" / 4: the
 *                         all_reduce tensor, the all_gather output, the reduce_scatter input, the
 *                         all_to_all per-rank input), run WARMUP calls; answers "ok"
 *   run ITERS             barrier, then ITERS back-to-back calls; answers the slowest rank's mean
 *                         seconds per call
 *   quit
 *
 * all_reduce runs in place (MPI_IN_PLACE), as torch's all_reduce does.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL };

struct cell {
  enum op op;
  long count;  /* floats in the full buffer */
  long block;  /* count / world: one rank's share */
  float *in, *out;
};

static int world, rank;

static void die(const char *what) {
  fprintf(stderr, "mpi_loop rank %d: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static int parse_op(const char *name, enum op *op) {
  static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  for (int i = 0; i < 4; ++i)
    if (strcmp(name, names[i]) == 0) {
      *op = (enum op)i;
      return 1;
    }
  return 0;
}

static float *filled(long n, float value) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!p) die("out of memory");
  for (long i = 0; i < n; ++i) p[i] = value;
  return p;
}

static void free_cell(struct cell *c) {
  free(c->in);
  free(c->out);
  c->in = c->out = NULL;
}

/* Input and output sizes as in the benchmark's torch buffers (bench._buffers). */
static void alloc_cell(struct cell *c) {
  long in = c->count, out = c->count;
  if (c->op == ALL_REDUCE) out = 0;
  if (c->op == ALL_GATHER) in = c->block;
  if (c->op == REDUCE_SCATTER) out = c->block;
  c->in = filled(in, 1.0f);
  c->out = filled(out, 0.0f);
}

static void call(const struct cell *c) {
  int b = (int)c->block;
  switch (c->op) {
    case ALL_REDUCE:
      MPI_Allreduce(MPI_IN_PLACE, c->in, (int)c->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALL_GATHER:
      MPI_Allgather(c->in, b, MPI_FLOAT, c->out, b, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(c->in, c->out, b, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALL_TO_ALL:
      MPI_Alltoall(c->in, b, MPI_FLOAT, c->out, b, MPI_FLOAT, MPI_COMM_WORLD);
      break;
  }
}

static double timed_round(const struct cell *c, long iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (long i = 0; i < iters; ++i) call(c);
  double mine = (MPI_Wtime() - start) / (double)iters, slowest = 0;
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  return slowest;
}

static void answer(FILE *result, const char *text) {
  if (rank != 0) return;
  fputs(text, result);
  fflush(result);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 2) die("usage: mpi_loop CTL_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/cmd.%d", argv[1], rank);
  FILE *commands = fopen(path, "r");
  if (!commands) die("cannot open its command FIFO");
  FILE *result = NULL;
  if (rank == 0) {
    snprintf(path, sizeof path, "%s/result", argv[1]);
    result = fopen(path, "w");
    if (!result) die("cannot open the result FIFO");
  }
  struct cell c = {ALL_REDUCE, 0, 0, NULL, NULL};
  char line[256], name[64], text[64];
  while (fgets(line, sizeof line, commands)) {
    long count = 0, n = 0;
    if (sscanf(line, "cell %63s %ld %ld", name, &count, &n) == 3) {
      free_cell(&c);
      if (!parse_op(name, &c.op)) die("unknown op");
      if (count <= 0 || count % world != 0) die("COUNT must be a positive multiple of the world size");
      c.count = count;
      c.block = count / world;
      alloc_cell(&c);
      for (long i = 0; i < n; ++i) call(&c);
      MPI_Barrier(MPI_COMM_WORLD);
      answer(result, "ok\n");
    } else if (sscanf(line, "run %ld", &n) == 1) {
      if (!c.in) die("run before cell");
      double t = timed_round(&c, n);
      snprintf(text, sizeof text, "%.9e\n", t);
      answer(result, text);
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      die("unknown command");
    }
  }
  free_cell(&c);
  MPI_Finalize();
  return 0;
}
