void scheduled(const float *restrict img0, const float *restrict w1, float *restrict out2) {
  float pack3[144] = {0};
  float acc4[32] = {0};
  memset(out2, 0, sizeof(float) * 256);
  for (int y5 = 0; y5 < 8; ++y5) {
    for (int jp6 = 0; jp6 < 1; ++jp6) {
      /* register-blocked 4x8 contraction into out2 */
      for (int c7 = 0; c7 < 2; ++c7) {
        for (int u8 = 0; u8 < 3; ++u8) {
          for (int v9 = 0; v9 < 3; ++v9) {
            for (int jr10 = 0; jr10 < 8; ++jr10) {
              pack3[c7 * 72 + u8 * 24 + v9 * 8 + jr10] = img0[c7 * 100 + (y5 + u8) * 10 + (8*jp6 + jr10 + v9)]; /* pack a panel of the unit-stride operand */
            }
          }
        }
      }
      for (int ib11 = 0; ib11 < 1; ++ib11) {
        #pragma GCC unroll 4
        for (int ir12 = 0; ir12 < 4; ++ir12) {
          for (int jr10 = 0; jr10 < 8; ++jr10) {
            acc4[ir12 * 8 + jr10] = out2[(4*ib11 + ir12) * 64 + y5 * 8 + (8*jp6 + jr10)];
          }
        }
        for (int c13 = 0; c13 < 2; ++c13) {
          for (int u14 = 0; u14 < 3; ++u14) {
            for (int v15 = 0; v15 < 3; ++v15) {
              #pragma GCC unroll 4
              for (int ir12 = 0; ir12 < 4; ++ir12) {
                for (int jr10 = 0; jr10 < 8; ++jr10) {
                  acc4[ir12 * 8 + jr10] = fmaf(w1[(4*ib11 + ir12) * 18 + c13 * 9 + u14 * 3 + v15], pack3[c13 * 72 + u14 * 24 + v15 * 8 + jr10], acc4[ir12 * 8 + jr10]);
                }
              }
            }
          }
        }
        #pragma GCC unroll 4
        for (int ir12 = 0; ir12 < 4; ++ir12) {
          for (int jr10 = 0; jr10 < 8; ++jr10) {
            out2[(4*ib11 + ir12) * 64 + y5 * 8 + (8*jp6 + jr10)] = acc4[ir12 * 8 + jr10];
          }
        }
      }
    }
  }
}
