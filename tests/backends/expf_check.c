/* Checks einjit's own expf (backends/c_math.py) over the float bit patterns 0, s, 2s, ... < 2^32:
   its vectorized and scalar forms give the same bits, the specials (NaN, infinities, overflow
   to inf, underflow to 0) are exact, and it reports the largest error against the double
   exp in ulps of the correctly rounded float, for normal results and apart for subnormal ones
   (units of 2^-149: the steps' float32 result rounds once more into their grid).
   tests/backends/test_own_exp.py compiles it with the helper text in a header (`-include`).
   `expf_check STRIDE [OUT]` prints "vector_differs N special_wrong N max_ulp E
   max_ulp_subnormal E" and writes the vectorized results to OUT. Stride 1 is the exhaustive
   check (about five minutes on one core). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4096

__attribute__((noinline)) static void vectorized(const float *restrict x, float *restrict y) {
  for (int i = 0; i < BLOCK; i++) y[i] = einjit_expf(x[i]);
}

__attribute__((noinline, optimize("no-tree-vectorize"))) static void scalar(const float *restrict x,
                                                                             float *restrict y) {
  for (int i = 0; i < BLOCK; i++) y[i] = einjit_expf(x[i]);
}

/* |y - exp(x)| in units of the float ulp at the correctly rounded result (2^-149 below the normals). */
static double ulp_error(float x, float y) {
  const double ref = exp((double)x);
  int e;
  frexp((double)(float)ref, &e);
  const double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
  return fabs((double)y - ref) / ulp;
}

static int special_wrong(float x, float y) {
  const float ref = (float)exp((double)x);
  if (isnan(x)) return !isnan(y);
  if (isinf(ref) || ref == 0.0f) return y != ref;
  return !isfinite(y);
}

int main(int argc, char **argv) {
  const unsigned long long stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  FILE *out = argc > 2 ? fopen(argv[2], "wb") : NULL;
  static float x[BLOCK], y[BLOCK], z[BLOCK];
  unsigned long long bits = 0, differs = 0, wrong = 0;
  double max_ulp = 0, max_sub = 0;
  if (stride == 0 || (argc > 2 && !out)) return 2;
  while (bits < (1ull << 32)) {
    int k = 0;
    for (; k < BLOCK && bits < (1ull << 32); k++, bits += stride) {
      const unsigned int u = (unsigned int)bits;
      memcpy(&x[k], &u, 4);
    }
    vectorized(x, y);
    scalar(x, z);
    for (int i = 0; i < k; i++) {
      differs += memcmp(&y[i], &z[i], 4) != 0;
      if (special_wrong(x[i], y[i])) {
        wrong++;
      } else if (!isnan(x[i]) && isfinite(y[i]) && (float)exp((double)x[i]) != 0.0f) {
        const double err = ulp_error(x[i], y[i]);
        if (exp((double)x[i]) < 0x1p-126)
          max_sub = err > max_sub ? err : max_sub;
        else
          max_ulp = err > max_ulp ? err : max_ulp;
      }
    }
    if (out && fwrite(y, sizeof(float), (size_t)k, out) != (size_t)k) return 3;
  }
  if (out) fclose(out);
  printf("vector_differs %llu special_wrong %llu max_ulp %.4f max_ulp_subnormal %.4f\n", differs, wrong, max_ulp,
         max_sub);
  return 0;
}
