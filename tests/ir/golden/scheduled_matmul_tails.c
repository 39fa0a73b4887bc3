void scheduled(const float *restrict a, float *restrict c, const float *restrict b) {
  float pack[288] = {0};
  einjit_f32x16 acc[12] = {0};
  float edge[192] = {0};
  memset(c, 0, sizeof(float) * 495);
  /* register-blocked 6x32 contraction into c0, from zero */
  for (int jr1 = 0; jr1 < 32; ++jr1) {
    for (int k2 = 0; k2 < 9; ++k2) {
      pack[k2 * 32 + jr1] = b[jr1 * 9 + k2]; /* pack a panel of the unit-stride operand */
    }
  }
  #pragma GCC unroll 6
  for (int ir3 = 0; ir3 < 6; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      acc[ir3 * 2 + jv4] = einjit_splat_f32x16(0.0f);
    }
  }
  for (int k2 = 0; k2 < 9; ++k2) {
    #pragma GCC unroll 6
    for (int ir3 = 0; ir3 < 6; ++ir3) {
      #pragma GCC unroll 2
      for (int jv4 = 0; jv4 < 2; ++jv4) {
        acc[ir3 * 2 + jv4] = einjit_fma_f32x16(einjit_splat_f32x16(a[ir3 * 9 + k2]), einjit_load_f32x16(&pack[k2 * 32 + (16*jv4)]), acc[ir3 * 2 + jv4]);
      }
    }
  }
  #pragma GCC unroll 6
  for (int ir3 = 0; ir3 < 6; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      einjit_store_f32x16(&c[ir3 * 45 + (16*jv4)], acc[ir3 * 2 + jv4]);
    }
  }
  /* the last 5 of 11 rows */
  #pragma GCC unroll 5
  for (int ir3 = 0; ir3 < 5; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      acc[ir3 * 2 + jv4] = einjit_splat_f32x16(0.0f);
    }
  }
  for (int k2 = 0; k2 < 9; ++k2) {
    #pragma GCC unroll 5
    for (int ir3 = 0; ir3 < 5; ++ir3) {
      #pragma GCC unroll 2
      for (int jv4 = 0; jv4 < 2; ++jv4) {
        acc[ir3 * 2 + jv4] = einjit_fma_f32x16(einjit_splat_f32x16(a[(ir3 + 6) * 9 + k2]), einjit_load_f32x16(&pack[k2 * 32 + (16*jv4)]), acc[ir3 * 2 + jv4]);
      }
    }
  }
  #pragma GCC unroll 5
  for (int ir3 = 0; ir3 < 5; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      einjit_store_f32x16(&c[(ir3 + 6) * 45 + (16*jv4)], acc[ir3 * 2 + jv4]);
    }
  }
  /* the last 13 of 45 columns, padded to 32 */
  for (int jr1 = 0; jr1 < 13; ++jr1) {
    for (int k2 = 0; k2 < 9; ++k2) {
      pack[k2 * 32 + jr1] = b[(jr1 + 32) * 9 + k2]; /* pack a panel of the unit-stride operand */
    }
  }
  for (int k2 = 0; k2 < 9; ++k2) {
    for (int jr1 = 13; jr1 < 32; ++jr1) {
      pack[k2 * 32 + jr1] = 0.0f;
    }
  }
  #pragma GCC unroll 6
  for (int ir3 = 0; ir3 < 6; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      acc[ir3 * 2 + jv4] = einjit_splat_f32x16(0.0f);
    }
  }
  for (int k2 = 0; k2 < 9; ++k2) {
    #pragma GCC unroll 6
    for (int ir3 = 0; ir3 < 6; ++ir3) {
      #pragma GCC unroll 2
      for (int jv4 = 0; jv4 < 2; ++jv4) {
        acc[ir3 * 2 + jv4] = einjit_fma_f32x16(einjit_splat_f32x16(a[ir3 * 9 + k2]), einjit_load_f32x16(&pack[k2 * 32 + (16*jv4)]), acc[ir3 * 2 + jv4]);
      }
    }
  }
  #pragma GCC unroll 6
  for (int ir3 = 0; ir3 < 6; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      einjit_store_f32x16(&edge[ir3 * 32 + (16*jv4)], acc[ir3 * 2 + jv4]);
    }
  }
  #pragma GCC unroll 6
  for (int ir3 = 0; ir3 < 6; ++ir3) {
    for (int jr1 = 0; jr1 < 13; ++jr1) {
      c[ir3 * 45 + (jr1 + 32)] = edge[ir3 * 32 + jr1];
    }
  }
  /* the last 5 of 11 rows */
  #pragma GCC unroll 5
  for (int ir3 = 0; ir3 < 5; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      acc[ir3 * 2 + jv4] = einjit_splat_f32x16(0.0f);
    }
  }
  for (int k2 = 0; k2 < 9; ++k2) {
    #pragma GCC unroll 5
    for (int ir3 = 0; ir3 < 5; ++ir3) {
      #pragma GCC unroll 2
      for (int jv4 = 0; jv4 < 2; ++jv4) {
        acc[ir3 * 2 + jv4] = einjit_fma_f32x16(einjit_splat_f32x16(a[(ir3 + 6) * 9 + k2]), einjit_load_f32x16(&pack[k2 * 32 + (16*jv4)]), acc[ir3 * 2 + jv4]);
      }
    }
  }
  #pragma GCC unroll 5
  for (int ir3 = 0; ir3 < 5; ++ir3) {
    #pragma GCC unroll 2
    for (int jv4 = 0; jv4 < 2; ++jv4) {
      einjit_store_f32x16(&edge[ir3 * 32 + (16*jv4)], acc[ir3 * 2 + jv4]);
    }
  }
  #pragma GCC unroll 5
  for (int ir3 = 0; ir3 < 5; ++ir3) {
    for (int jr1 = 0; jr1 < 13; ++jr1) {
      c[(ir3 + 6) * 45 + (jr1 + 32)] = edge[ir3 * 32 + jr1];
    }
  }
}
