void scheduled(const float *restrict a0, float *restrict c1, const float *restrict b2) {
  float pack3[1024] = {0};
  float acc4[256] = {0};
  memset(c1, 0, sizeof(float) * 4096);
  for (int jp5 = 0; jp5 < 2; ++jp5) {
    /* register-blocked 8x32 contraction into c1 */
    for (int k6 = 0; k6 < 32; ++k6) {
      for (int jr7 = 0; jr7 < 32; ++jr7) {
        pack3[k6 * 32 + jr7] = b2[(32*jp5 + jr7) * 32 + k6]; /* pack a panel of the unit-stride operand */
      }
    }
    for (int ib8 = 0; ib8 < 8; ++ib8) {
      #pragma GCC unroll 8
      for (int ir9 = 0; ir9 < 8; ++ir9) {
        for (int jr7 = 0; jr7 < 32; ++jr7) {
          acc4[ir9 * 32 + jr7] = c1[(8*ib8 + ir9) * 64 + (32*jp5 + jr7)];
        }
      }
      for (int k10 = 0; k10 < 32; ++k10) {
        #pragma GCC unroll 8
        for (int ir9 = 0; ir9 < 8; ++ir9) {
          for (int jr7 = 0; jr7 < 32; ++jr7) {
            acc4[ir9 * 32 + jr7] = fmaf(a0[(8*ib8 + ir9) * 32 + k10], pack3[k10 * 32 + jr7], acc4[ir9 * 32 + jr7]);
          }
        }
      }
      #pragma GCC unroll 8
      for (int ir9 = 0; ir9 < 8; ++ir9) {
        for (int jr7 = 0; jr7 < 32; ++jr7) {
          c1[(8*ib8 + ir9) * 64 + (32*jp5 + jr7)] = acc4[ir9 * 32 + jr7];
        }
      }
    }
  }
}
