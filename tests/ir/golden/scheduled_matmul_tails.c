void scheduled(const float *restrict a, float *restrict c, const float *restrict b) {
  float pack[288] = {0};
  float acc[224] = {0};
  memset(c, 0, sizeof(float) * 495);
  /* register-blocked 7x32 contraction into c0 */
  for (int k1 = 0; k1 < 9; ++k1) {
    for (int jr2 = 0; jr2 < 32; ++jr2) {
      pack[k1 * 32 + jr2] = b[jr2 * 9 + k1]; /* pack a panel of the unit-stride operand */
    }
  }
  #pragma GCC unroll 7
  for (int ir3 = 0; ir3 < 7; ++ir3) {
    for (int jr2 = 0; jr2 < 32; ++jr2) {
      acc[ir3 * 32 + jr2] = c[ir3 * 45 + jr2];
    }
  }
  for (int k1 = 0; k1 < 9; ++k1) {
    #pragma GCC unroll 7
    for (int ir3 = 0; ir3 < 7; ++ir3) {
      for (int jr2 = 0; jr2 < 32; ++jr2) {
        acc[ir3 * 32 + jr2] = fmaf(a[ir3 * 9 + k1], pack[k1 * 32 + jr2], acc[ir3 * 32 + jr2]);
      }
    }
  }
  #pragma GCC unroll 7
  for (int ir3 = 0; ir3 < 7; ++ir3) {
    for (int jr2 = 0; jr2 < 32; ++jr2) {
      c[ir3 * 45 + jr2] = acc[ir3 * 32 + jr2];
    }
  }
  /* the last 4 of 11 rows */
  #pragma GCC unroll 4
  for (int ir3 = 0; ir3 < 4; ++ir3) {
    for (int jr2 = 0; jr2 < 32; ++jr2) {
      acc[ir3 * 32 + jr2] = c[(ir3 + 7) * 45 + jr2];
    }
  }
  for (int k1 = 0; k1 < 9; ++k1) {
    #pragma GCC unroll 4
    for (int ir3 = 0; ir3 < 4; ++ir3) {
      for (int jr2 = 0; jr2 < 32; ++jr2) {
        acc[ir3 * 32 + jr2] = fmaf(a[(ir3 + 7) * 9 + k1], pack[k1 * 32 + jr2], acc[ir3 * 32 + jr2]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int ir3 = 0; ir3 < 4; ++ir3) {
    for (int jr2 = 0; jr2 < 32; ++jr2) {
      c[(ir3 + 7) * 45 + jr2] = acc[ir3 * 32 + jr2];
    }
  }
  /* the last 13 of 45 columns, padded to 32 */
  for (int k1 = 0; k1 < 9; ++k1) {
    for (int jr2 = 0; jr2 < 13; ++jr2) {
      pack[k1 * 32 + jr2] = b[(jr2 + 32) * 9 + k1]; /* pack a panel of the unit-stride operand */
    }
  }
  for (int k1 = 0; k1 < 9; ++k1) {
    for (int jr2 = 13; jr2 < 32; ++jr2) {
      pack[k1 * 32 + jr2] = 0.0f;
    }
  }
  #pragma GCC unroll 7
  for (int ir3 = 0; ir3 < 7; ++ir3) {
    for (int jr2 = 0; jr2 < 13; ++jr2) {
      acc[ir3 * 32 + jr2] = c[ir3 * 45 + (jr2 + 32)];
    }
  }
  #pragma GCC unroll 7
  for (int ir3 = 0; ir3 < 7; ++ir3) {
    for (int jr2 = 13; jr2 < 32; ++jr2) {
      acc[ir3 * 32 + jr2] = 0.0f;
    }
  }
  for (int k1 = 0; k1 < 9; ++k1) {
    #pragma GCC unroll 7
    for (int ir3 = 0; ir3 < 7; ++ir3) {
      for (int jr2 = 0; jr2 < 32; ++jr2) {
        acc[ir3 * 32 + jr2] = fmaf(a[ir3 * 9 + k1], pack[k1 * 32 + jr2], acc[ir3 * 32 + jr2]);
      }
    }
  }
  #pragma GCC unroll 7
  for (int ir3 = 0; ir3 < 7; ++ir3) {
    for (int jr2 = 0; jr2 < 13; ++jr2) {
      c[ir3 * 45 + (jr2 + 32)] = acc[ir3 * 32 + jr2];
    }
  }
  /* the last 4 of 11 rows */
  #pragma GCC unroll 4
  for (int ir3 = 0; ir3 < 4; ++ir3) {
    for (int jr2 = 0; jr2 < 13; ++jr2) {
      acc[ir3 * 32 + jr2] = c[(ir3 + 7) * 45 + (jr2 + 32)];
    }
  }
  #pragma GCC unroll 4
  for (int ir3 = 0; ir3 < 4; ++ir3) {
    for (int jr2 = 13; jr2 < 32; ++jr2) {
      acc[ir3 * 32 + jr2] = 0.0f;
    }
  }
  for (int k1 = 0; k1 < 9; ++k1) {
    #pragma GCC unroll 4
    for (int ir3 = 0; ir3 < 4; ++ir3) {
      for (int jr2 = 0; jr2 < 32; ++jr2) {
        acc[ir3 * 32 + jr2] = fmaf(a[(ir3 + 7) * 9 + k1], pack[k1 * 32 + jr2], acc[ir3 * 32 + jr2]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int ir3 = 0; ir3 < 4; ++ir3) {
    for (int jr2 = 0; jr2 < 13; ++jr2) {
      c[(ir3 + 7) * 45 + (jr2 + 32)] = acc[ir3 * 32 + jr2];
    }
  }
}
