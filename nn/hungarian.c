#include "nn/hungarian.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *lsa_status_str(LsaStatus s) {
  switch (s) {
    case LSA_OK: return "ok";
    case LSA_INVALID: return "cost matrix contains NaN or -inf";
    case LSA_INFEASIBLE: return "cost matrix is infeasible (forbidden +inf entries leave no complete assignment)";
  }
  return "unknown";
}

typedef struct {
  int64_t nr, nc;  // nr <= nc
  const double *cost;
  double *u, *v, *shortest;  // row/column potentials [nr], [nc]; path costs [nc]
  int64_t *path, *col4row, *row4col, *remaining;
  bool *sr, *sc;  // rows / columns reached by the current search
} Lsa;

// Dijkstra-like search from row `i` for the cheapest path to a free column, on reduced costs.
// Returns the sink column, or -1 when every remaining column is unreachable (+inf).
static int64_t augmenting_path(Lsa *s, int64_t i, double *min_val_out) {
  int64_t nc = s->nc, num_remaining = nc;
  double min_val = 0;
  // Reverse order: a constant cost matrix yields the identity assignment (scipy's choice).
  for (int64_t it = 0; it < nc; it++) s->remaining[it] = nc - it - 1;
  for (int64_t r = 0; r < s->nr; r++) s->sr[r] = false;
  for (int64_t j = 0; j < nc; j++) {
    s->sc[j] = false;
    s->shortest[j] = INFINITY;
  }
  int64_t sink = -1;
  while (sink == -1) {
    int64_t index = -1;
    double lowest = INFINITY;
    s->sr[i] = true;
    for (int64_t it = 0; it < num_remaining; it++) {
      int64_t j = s->remaining[it];
      double r = min_val + s->cost[i * nc + j] - s->u[i] - s->v[j];
      if (r < s->shortest[j]) {
        s->path[j] = i;
        s->shortest[j] = r;
      }
      // Among equal costs prefer a free column: it ends the search (matters for integer costs).
      if (s->shortest[j] < lowest || (s->shortest[j] == lowest && s->row4col[j] == -1)) {
        lowest = s->shortest[j];
        index = it;
      }
    }
    min_val = lowest;
    if (min_val == INFINITY) return -1;
    int64_t j = s->remaining[index];
    if (s->row4col[j] == -1) sink = j;
    else i = s->row4col[j];
    s->sc[j] = true;
    s->remaining[index] = s->remaining[--num_remaining];
  }
  *min_val_out = min_val;
  return sink;
}

// Takes the path that augmenting_path found from row cur to column sink (path cost min_val): the
// duals updated so that reduced costs stay non-negative and tight on the matching, then the path
// flipped, every row on it taking the next column.
static void augment(Lsa *s, int64_t cur, int64_t sink, double min_val) {
  s->u[cur] += min_val;
  for (int64_t i = 0; i < s->nr; i++)
    if (s->sr[i] && i != cur) s->u[i] += min_val - s->shortest[s->col4row[i]];
  for (int64_t j = 0; j < s->nc; j++)
    if (s->sc[j]) s->v[j] -= min_val - s->shortest[j];
  for (int64_t j = sink;;) {
    int64_t i = s->path[j];
    s->row4col[j] = i;
    int64_t previous = s->col4row[i];
    s->col4row[i] = j;
    j = previous;
    if (i == cur) break;
  }
}

// The assignment as (row_of[k], col_of[k]) pairs in row order, rows of the original matrix (a tall
// one was solved transposed).
static void write_pairs(const Lsa *s, bool transpose, int64_t rows, int64_t *row_of, int64_t *col_of) {
  if (transpose) {  // pairs (col4row[k], k), in the order of their original row col4row[k]
    // [rows], -1 = unmatched
    int64_t *col_of_row = detr_malloc((size_t)rows * sizeof(int64_t), "linear_sum_assignment col_of_row");
    for (int64_t i = 0; i < rows; i++) col_of_row[i] = -1;
    for (int64_t k = 0; k < s->nr; k++) col_of_row[s->col4row[k]] = k;
    int64_t n = 0;
    for (int64_t i = 0; i < rows; i++)
      if (col_of_row[i] >= 0) {
        row_of[n] = i;
        col_of[n++] = col_of_row[i];
      }
    free(col_of_row);
  } else {
    for (int64_t i = 0; i < s->nr; i++) {
      row_of[i] = i;
      col_of[i] = s->col4row[i];
    }
  }
}

LsaStatus linear_sum_assignment(int64_t rows, int64_t cols, const double *cost, int64_t *row_of, int64_t *col_of,
                                int64_t *bad_row, int64_t *bad_col) {
  for (int64_t k = 0; k < rows * cols; k++) {
    if (isnan(cost[k]) || cost[k] == -INFINITY) {
      if (bad_row) *bad_row = k / cols;
      if (bad_col) *bad_col = k % cols;
      return LSA_INVALID;
    }
  }
  if (rows == 0 || cols == 0) return LSA_OK;
  // Tall matrices are solved transposed (the search runs over the shorter side).
  bool transpose = cols < rows;
  int64_t nr = transpose ? cols : rows, nc = transpose ? rows : cols;
  double *transposed = NULL;
  if (transpose) {
    transposed = detr_malloc((size_t)(nr * nc) * sizeof(double), "linear_sum_assignment transposed");
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) transposed[j * rows + i] = cost[i * cols + j];
  }
  // One block for all work arrays: [u nr][v nc][shortest nc] doubles, then the index arrays.
  size_t doubles = (size_t)(nr + 2 * nc), ints = (size_t)(nc + nr + nc + nc);
  char *block = detr_calloc(1, doubles * sizeof(double) + ints * sizeof(int64_t) + (size_t)(nr + nc),
                            "linear_sum_assignment block");
  Lsa s = {.nr = nr, .nc = nc, .cost = transpose ? transposed : cost};
  s.u = (double *)block;
  s.v = s.u + nr;
  s.shortest = s.v + nc;
  s.path = (int64_t *)(s.shortest + nc);
  s.col4row = s.path + nc;
  s.row4col = s.col4row + nr;
  s.remaining = s.row4col + nc;
  s.sr = (bool *)(s.remaining + nc);
  s.sc = s.sr + nr;
  for (int64_t i = 0; i < nr; i++) s.col4row[i] = -1;
  for (int64_t j = 0; j < nc; j++) s.row4col[j] = s.path[j] = -1;

  LsaStatus status = LSA_OK;
  for (int64_t cur = 0; cur < nr; cur++) {
    double min_val = 0;
    int64_t sink = augmenting_path(&s, cur, &min_val);
    if (sink < 0) {
      status = LSA_INFEASIBLE;
      break;
    }
    augment(&s, cur, sink, min_val);
  }
  if (status == LSA_OK) write_pairs(&s, transpose, rows, row_of, col_of);
  free(block);
  free(transposed);
  return status;
}
