void scheduled(const float *restrict img, const float *restrict w, float *restrict out) {
  float pack[288] = {0};
  float acc[128] = {0};
  memset(out, 0, sizeof(float) * 1152);
  for (int jp0 = 0; jp0 < 1; ++jp0) {
    /* channel-blocked 8x16 convolution into out1 */
    for (int c2 = 0; c2 < 2; ++c2) {
      for (int u3 = 0; u3 < 3; ++u3) {
        for (int v4 = 0; v4 < 3; ++v4) {
          for (int jr5 = 0; jr5 < 16; ++jr5) {
            pack[c2 * 144 + u3 * 48 + v4 * 16 + jr5] = w[(16*jp0 + jr5) * 18 + c2 * 9 + u3 * 3 + v4]; /* pack a panel of the vector-axis operand */
          }
        }
      }
    }
    for (int y6 = 0; y6 < 3; ++y6) {
      for (int x7 = 0; x7 < 3; ++x7) {
        for (int ib8 = 0; ib8 < 1; ++ib8) {
          #pragma GCC unroll 8
          for (int ir9 = 0; ir9 < 8; ++ir9) {
            for (int jr5 = 0; jr5 < 16; ++jr5) {
              acc[ir9 * 16 + jr5] = out[(8*ib8 + ir9) * 144 + (16*jp0 + jr5) * 9 + y6 * 3 + x7];
            }
          }
          for (int c10 = 0; c10 < 2; ++c10) {
            for (int u11 = 0; u11 < 3; ++u11) {
              for (int v12 = 0; v12 < 3; ++v12) {
                #pragma GCC unroll 8
                for (int ir9 = 0; ir9 < 8; ++ir9) {
                  for (int jr5 = 0; jr5 < 16; ++jr5) {
                    acc[ir9 * 16 + jr5] = fmaf(img[(8*ib8 + ir9) * 50 + c10 * 25 + (y6 + u11) * 5 + (x7 + v12)], pack[c10 * 144 + u11 * 48 + v12 * 16 + jr5], acc[ir9 * 16 + jr5]);
                  }
                }
              }
            }
          }
          #pragma GCC unroll 8
          for (int ir9 = 0; ir9 < 8; ++ir9) {
            for (int jr5 = 0; jr5 < 16; ++jr5) {
              out[(8*ib8 + ir9) * 144 + (16*jp0 + jr5) * 9 + y6 * 3 + x7] = acc[ir9 * 16 + jr5];
            }
          }
        }
      }
    }
  }
}
