// Exact minimum-cost rectangular linear assignment (shortest augmenting paths with dual
// potentials: Jonker-Volgenant as refined by Crouse 2016), the algorithm of scipy's
// linear_sum_assignment, with the same tie-breaking so DETR's matches come out identical.
// O(min(r,c)^2 max(r,c)). Host code: DETR's matcher copies only the cost matrices to the host.
#pragma once
#include <stdint.h>

typedef enum {
  LSA_OK = 0,
  LSA_INVALID,     // a NaN or -inf cost
  LSA_INFEASIBLE,  // +inf (forbidden) entries leave no complete assignment
} LsaStatus;

// cost: rows x cols, row-major doubles. Writes min(rows, cols) pairs (row_of[k], col_of[k]) with
// row_of ascending. On LSA_INVALID, *bad_row / *bad_col (if not NULL) locate the offending entry.
LsaStatus linear_sum_assignment(int64_t rows, int64_t cols, const double *cost, int64_t *row_of, int64_t *col_of,
                                int64_t *bad_row, int64_t *bad_col);
const char *lsa_status_str(LsaStatus s);
