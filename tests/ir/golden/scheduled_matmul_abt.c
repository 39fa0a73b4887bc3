void scheduled(const float *restrict a, float *restrict c, const float *restrict b) {
  float pack[1024] = {0};
  einjit_f32x16 acc[16] = {0};
  memset(c, 0, sizeof(float) * 4096);
  /* register-blocked 8x32 contraction into c0, from zero */
  for (int jp1 = 0; jp1 < 2; ++jp1) {
    for (int jr2 = 0; jr2 < 32; jr2 += 8) {
      for (int k3 = 0; k3 < 32; k3 += 8) {
        einjit_transpose_f32x8(&pack[k3 * 32 + jr2], 32, &b[(32*jp1 + jr2) * 32 + k3], 32); /* pack a panel of the unit-stride operand, 8x8 blocks */
      }
    }
    for (int ib4 = 0; ib4 < 8; ++ib4) {
      #pragma GCC unroll 8
      for (int ir5 = 0; ir5 < 8; ++ir5) {
        #pragma GCC unroll 2
        for (int jv6 = 0; jv6 < 2; ++jv6) {
          acc[ir5 * 2 + jv6] = einjit_splat_f32x16(0.0f);
        }
      }
      for (int k3 = 0; k3 < 32; ++k3) {
        #pragma GCC unroll 8
        for (int ir5 = 0; ir5 < 8; ++ir5) {
          #pragma GCC unroll 2
          for (int jv6 = 0; jv6 < 2; ++jv6) {
            acc[ir5 * 2 + jv6] = einjit_fma_f32x16(einjit_splat_f32x16(a[(8*ib4 + ir5) * 32 + k3]), einjit_load_f32x16(&pack[k3 * 32 + (16*jv6)]), acc[ir5 * 2 + jv6]);
          }
        }
      }
      #pragma GCC unroll 8
      for (int ir5 = 0; ir5 < 8; ++ir5) {
        #pragma GCC unroll 2
        for (int jv6 = 0; jv6 < 2; ++jv6) {
          einjit_store_f32x16(&c[(8*ib4 + ir5) * 64 + (32*jp1 + 16*jv6)], acc[ir5 * 2 + jv6]);
        }
      }
    }
  }
}
