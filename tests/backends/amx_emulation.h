/* Test-only: the AMX tile intrinsics einjit's tile kernels use (`backends/amx_tiles.py`), as plain C
   following Intel's pseudo-code (Intel SDM, LDTILECFG, TILELOADD, TILESTORED, TDPBF16PS), so that
   the rendering's indexing runs on a CPU without AMX. Included first (`gcc -include`): it includes
   the real header, replaces the tile macros and functions, then says the compiler targets AMX.

   The state is per thread, like the hardware's: a tile instruction in a thread that has not
   loaded a configuration aborts, as do rows or bytes per row past what the configuration gives.
   EINJIT_AMX_EMULATE_REFUSAL makes the permission request fail (the kernel refusing AMX); the
   tile instructions must then never run. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#undef _tile_zero

typedef struct {
  unsigned char palette, start_row, reserved[14];
  unsigned short colsb[16];
  unsigned char rows[16];
} einjit_emu_config;

static __thread struct {
  int configured;
  einjit_emu_config cfg;
  unsigned char data[8][16][64];
} einjit_emu;

static void einjit_emu_loadconfig(const void *config) {
  memcpy(&einjit_emu.cfg, config, sizeof einjit_emu.cfg);
  if (einjit_emu.cfg.palette != 1) abort();
  for (int t = 0; t < 8; ++t)
    if (einjit_emu.cfg.rows[t] > 16 || einjit_emu.cfg.colsb[t] > 64) abort();
  memset(einjit_emu.data, 0, sizeof einjit_emu.data);
  einjit_emu.configured = 1;
}

static void einjit_emu_check(int t) {
  if (!einjit_emu.configured || t < 0 || t > 7) abort();
}

/* TILELOADD: `rows` rows of `colsb` bytes, `stride` bytes apart; the rest of the tile zeroed. */
static void einjit_emu_loadd(int t, const void *base, long stride) {
  einjit_emu_check(t);
  memset(einjit_emu.data[t], 0, sizeof einjit_emu.data[t]);
  for (int r = 0; r < einjit_emu.cfg.rows[t]; ++r)
    memcpy(einjit_emu.data[t][r], (const unsigned char *)base + r * stride, einjit_emu.cfg.colsb[t]);
}

static void einjit_emu_stored(int t, void *base, long stride) {
  einjit_emu_check(t);
  for (int r = 0; r < einjit_emu.cfg.rows[t]; ++r)
    memcpy((unsigned char *)base + r * stride, einjit_emu.data[t][r], einjit_emu.cfg.colsb[t]);
}

static float einjit_emu_bf16(const unsigned char *p) {
  unsigned short h;
  memcpy(&h, p, 2);
  unsigned int u = (unsigned int)h << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u; /* DAZ */
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float einjit_emu_ftz(float f) {
  unsigned int u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&f, &u, 4);
  return f;
}

/* TDPBF16PS: for every row m of dst and pair k of a's row, for every column n:
   dst[m][n] += a[m][2k] * b[k][2n], then dst[m][n] += a[m][2k+1] * b[k][2n+1], each product of
   two bf16 numbers exact in float, each addition rounded to nearest even (compiled without
   contraction, `-ffp-contract=off`), inputs and outputs flushed to zero. */
static void einjit_emu_dpbf16ps(int dst, int a, int b) {
  einjit_emu_check(dst);
  einjit_emu_check(a);
  einjit_emu_check(b);
  const einjit_emu_config *c = &einjit_emu.cfg;
  if (c->rows[a] != c->rows[dst] || c->colsb[b] != c->colsb[dst] || c->rows[b] * 4 != c->colsb[a]) abort();
  for (int m = 0; m < c->rows[dst]; ++m) {
    float *row = (float *)einjit_emu.data[dst][m];
    for (int k = 0; k < c->colsb[a] / 4; ++k)
      for (int n = 0; n < c->colsb[dst] / 4; ++n) {
        float acc = row[n];
        acc = einjit_emu_ftz(acc + einjit_emu_bf16(&einjit_emu.data[a][m][4 * k]) *
                                     einjit_emu_bf16(&einjit_emu.data[b][k][4 * n]));
        acc = einjit_emu_ftz(acc + einjit_emu_bf16(&einjit_emu.data[a][m][4 * k + 2]) *
                                     einjit_emu_bf16(&einjit_emu.data[b][k][4 * n + 2]));
        row[n] = acc;
      }
  }
}

#define _tile_loadconfig(config) einjit_emu_loadconfig(config)
#define _tile_loadd(t, base, stride) einjit_emu_loadd(t, base, stride)
#define _tile_stored(t, base, stride) einjit_emu_stored(t, base, stride)
#define _tile_dpbf16ps(dst, a, b) einjit_emu_dpbf16ps(dst, a, b)

#ifdef EINJIT_AMX_EMULATE_REFUSAL
#define EINJIT_AMX_REQUEST() (-1)
#else
#define EINJIT_AMX_REQUEST() 0
#endif

#define __AMX_TILE__ 1
#define __AMX_BF16__ 1
