void scheduled(const float *restrict img, const float *restrict w, float *restrict out) {
  float pack[144] = {0};
  einjit_f32x8 acc[4] = {0};
  memset(out, 0, sizeof(float) * 256);
  for (int y0 = 0; y0 < 8; ++y0) {
    /* register-blocked 4x8 contraction into out1, from zero */
    for (int c2 = 0; c2 < 2; ++c2) {
      for (int u3 = 0; u3 < 3; ++u3) {
        for (int v4 = 0; v4 < 3; ++v4) {
          for (int jr5 = 0; jr5 < 8; ++jr5) {
            pack[c2 * 72 + u3 * 24 + v4 * 8 + jr5] = img[c2 * 100 + (y0 + u3) * 10 + (jr5 + v4)]; /* pack a panel of the unit-stride operand */
          }
        }
      }
    }
    #pragma GCC unroll 4
    for (int ir6 = 0; ir6 < 4; ++ir6) {
      #pragma GCC unroll 1
      for (int jv7 = 0; jv7 < 1; ++jv7) {
        acc[ir6 + jv7] = einjit_splat_f32x8(0.0f);
      }
    }
    for (int c2 = 0; c2 < 2; ++c2) {
      for (int u3 = 0; u3 < 3; ++u3) {
        for (int v4 = 0; v4 < 3; ++v4) {
          #pragma GCC unroll 4
          for (int ir6 = 0; ir6 < 4; ++ir6) {
            #pragma GCC unroll 1
            for (int jv7 = 0; jv7 < 1; ++jv7) {
              acc[ir6 + jv7] = einjit_fma_f32x8(einjit_splat_f32x8(w[ir6 * 18 + c2 * 9 + u3 * 3 + v4]), einjit_load_f32x8(&pack[c2 * 72 + u3 * 24 + v4 * 8 + (8*jv7)]), acc[ir6 + jv7]);
            }
          }
        }
      }
    }
    #pragma GCC unroll 4
    for (int ir6 = 0; ir6 < 4; ++ir6) {
      #pragma GCC unroll 1
      for (int jv7 = 0; jv7 < 1; ++jv7) {
        einjit_store_f32x8(&out[ir6 * 64 + y0 * 8 + (8*jv7)], acc[ir6 + jv7]);
      }
    }
  }
}
