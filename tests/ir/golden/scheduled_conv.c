void scheduled(const float *restrict img, const float *restrict w, float *restrict out) {
  float pack[144] = {0};
  float acc[32] = {0};
  memset(out, 0, sizeof(float) * 256);
  for (int y0 = 0; y0 < 8; ++y0) {
    for (int jp1 = 0; jp1 < 1; ++jp1) {
      /* register-blocked 4x8 contraction into out2 */
      for (int c3 = 0; c3 < 2; ++c3) {
        for (int u4 = 0; u4 < 3; ++u4) {
          for (int v5 = 0; v5 < 3; ++v5) {
            for (int jr6 = 0; jr6 < 8; ++jr6) {
              pack[c3 * 72 + u4 * 24 + v5 * 8 + jr6] = img[c3 * 100 + (y0 + u4) * 10 + (8*jp1 + jr6 + v5)]; /* pack a panel of the unit-stride operand */
            }
          }
        }
      }
      for (int ib7 = 0; ib7 < 1; ++ib7) {
        #pragma GCC unroll 4
        for (int ir8 = 0; ir8 < 4; ++ir8) {
          for (int jr6 = 0; jr6 < 8; ++jr6) {
            acc[ir8 * 8 + jr6] = out[(4*ib7 + ir8) * 64 + y0 * 8 + (8*jp1 + jr6)];
          }
        }
        for (int c9 = 0; c9 < 2; ++c9) {
          for (int u10 = 0; u10 < 3; ++u10) {
            for (int v11 = 0; v11 < 3; ++v11) {
              #pragma GCC unroll 4
              for (int ir8 = 0; ir8 < 4; ++ir8) {
                for (int jr6 = 0; jr6 < 8; ++jr6) {
                  acc[ir8 * 8 + jr6] = fmaf(w[(4*ib7 + ir8) * 18 + c9 * 9 + u10 * 3 + v11], pack[c9 * 72 + u10 * 24 + v11 * 8 + jr6], acc[ir8 * 8 + jr6]);
                }
              }
            }
          }
        }
        #pragma GCC unroll 4
        for (int ir8 = 0; ir8 < 4; ++ir8) {
          for (int jr6 = 0; jr6 < 8; ++jr6) {
            out[(4*ib7 + ir8) * 64 + y0 * 8 + (8*jp1 + jr6)] = acc[ir8 * 8 + jr6];
          }
        }
      }
    }
  }
}
