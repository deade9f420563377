// The op table: every differentiable op and every composite gradient suite, declared once (in
// the spirit of ggml's tests/test-backend-ops.cpp). One entry drives
//   - its finite-difference gradient test (test_grad NAME; ctest grad.NAME, registered from
//     `test_grad --list` after each build: tests/op_ctest.cmake),
//   - its CPU-vs-CUDA comparison (test_gpu; entries marked .cuda must be compared there, which
//     its last "ops" test, ops_coverage, enforces), and
//   - for unary and binary elementwise ops, the kernel-level CUDA test and the input ranges.
// Unary and binary entries are fully generic: name, op, input ranges, tolerance. Suite entries
// (OP_SUITE) name a test written by hand in test_grad.c (ops with several shapes and parameters,
// composites such as the criterion or an encoder layer); test_grad checks that every such entry
// has its test and every test its entry.
#pragma once
#include <stdbool.h>

#include "kernels/elementwise_math.h"
#include "tests/gradcheck.h"

typedef enum { OP_UNARY, OP_BINARY, OP_SUITE } OpKind;

// Uniform in [lo, hi), or (away) magnitudes in [lo, hi) with random signs: away from a kink or
// a pole at 0.
typedef struct {
  bool away;
  float lo, hi;
} ValueRange;

#define UNIFORM(l, h) \
  { .away = false, .lo = (l), .hi = (h) }
#define AWAY(l, h) \
  { .away = true, .lo = (l), .hi = (h) }

typedef struct {
  const char *name;  // ctest grad.NAME; test_gpu's comparisons are named from it
  OpKind kind;
  GradFn f;             // the op on its inputs (unary, binary)
  int kernel;           // its UnaryOp / BinaryOp: the kernel-level CUDA test (unary, binary)
  ValueRange range[2];  // each input's values, for the gradient check and the CUDA comparison
  ValueRange wide;      // unary: the kernel test's values, wider (clamps, large arguments)
  float kernel_param;   // unary: the kernel test's parameter
  GradTol tol;          // finite differences; {0}: eps 1e-2, atol 2e-3, rtol 1e-2
  bool cuda;            // test_gpu compares it alone with the CPU (composites: in the model steps)
} OpEntry;

extern const OpEntry OP_TABLE[];
extern const int OP_TABLE_COUNT;

// Shapes of the generic tests: the gradient check runs the first *_FD ones (finite differences
// cost two evaluations per element), test_gpu all of them (the larger ones reach every launch path).
#define UNARY_SHAPES 6
#define UNARY_SHAPES_FD 4
extern const Shape OP_UNARY_SHAPES[UNARY_SHAPES];
#define BINARY_PAIRS 8
#define BINARY_PAIRS_FD 6
extern const Shape OP_BINARY_PAIRS[BINARY_PAIRS][2];

const OpEntry *op_table_find(const char *name);
// The tolerance of an entry (the default where it has none).
GradTol op_tol(const OpEntry *e);
// A CPU leaf of the entry's input k: values from its range, seeded.
Tensor *op_input(const OpEntry *e, int k, Shape s, uint64_t seed, bool requires_grad);
// The table's own rules (unique names; every unary and binary kernel has exactly one entry).
// Returns NULL or what is wrong.
const char *op_table_problem(void);
