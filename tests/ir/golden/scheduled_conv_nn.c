void scheduled(const float *restrict img, const float *restrict w, float *restrict out) {
  float pack[288] = {0};
  einjit_f32x16 acc[8] = {0};
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
            #pragma GCC unroll 1
            for (int jv10 = 0; jv10 < 1; ++jv10) {
              for (int jl11 = 0; jl11 < 16; ++jl11) {
                acc[ir9 + jv10][jl11] = out[(8*ib8 + ir9) * 144 + (16*jp0 + 16*jv10 + jl11) * 9 + y6 * 3 + x7];
              }
            }
          }
          for (int c12 = 0; c12 < 2; ++c12) {
            for (int u13 = 0; u13 < 3; ++u13) {
              for (int v14 = 0; v14 < 3; ++v14) {
                #pragma GCC unroll 8
                for (int ir9 = 0; ir9 < 8; ++ir9) {
                  #pragma GCC unroll 1
                  for (int jv10 = 0; jv10 < 1; ++jv10) {
                    acc[ir9 + jv10] = einjit_fma_f32x16(einjit_splat_f32x16(img[(8*ib8 + ir9) * 50 + c12 * 25 + (y6 + u13) * 5 + (x7 + v14)]), einjit_load_f32x16(&pack[c12 * 144 + u13 * 48 + v14 * 16 + (16*jv10)]), acc[ir9 + jv10]);
                  }
                }
              }
            }
          }
          #pragma GCC unroll 8
          for (int ir9 = 0; ir9 < 8; ++ir9) {
            #pragma GCC unroll 1
            for (int jv10 = 0; jv10 < 1; ++jv10) {
              for (int jl11 = 0; jl11 < 16; ++jl11) {
                out[(8*ib8 + ir9) * 144 + (16*jp0 + 16*jv10 + jl11) * 9 + y6 * 3 + x7] = acc[ir9 + jv10][jl11];
              }
            }
          }
        }
      }
    }
  }
}
