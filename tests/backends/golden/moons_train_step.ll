/* forward scalar_loss */
for i0 = 0 to 9 {
  for i1 = 0 to 1 {
    moons_input[i0, i1] := moons_flat[batch0, i0, i1];
  }
}
for i2 = 0 to 9 {
  moons_class[i2, 0] := moons_classes[batch0, i2, 0];
}
for i3 = 0 to 9 {
  for i4 = 0 to 15 {
    n[i3, i4] := 0.0;
  }
}
for i5 = 0 to 9 {
  for i6 = 0 to 15 {
    for i7 = 0 to 1 {
      n[i5, i6] := (n[i5, i6] + (w1[i6, i7] * moons_input[i5, i7]));
    }
  }
}
for i8 = 0 to 9 {
  for i9 = 0 to 15 {
    n_2[i8, i9] := (b1[i9] + n[i8, i9]);
  }
}
for i10 = 0 to 9 {
  for i11 = 0 to 15 {
    h1[i10, i11] := relu(n_2[i10, i11]);
  }
}
for i12 = 0 to 9 {
  for i13 = 0 to 15 {
    n_3[i12, i13] := 0.0;
  }
}
for i14 = 0 to 9 {
  for i15 = 0 to 15 {
    for i16 = 0 to 15 {
      n_3[i14, i15] := (n_3[i14, i15] + (w2[i15, i16] * h1[i14, i16]));
    }
  }
}
for i17 = 0 to 9 {
  for i18 = 0 to 15 {
    n_4[i17, i18] := (b2[i18] + n_3[i17, i18]);
  }
}
for i19 = 0 to 9 {
  for i20 = 0 to 15 {
    h2[i19, i20] := relu(n_4[i19, i20]);
  }
}
for i21 = 0 to 9 {
  for i22 = 0 to 0 {
    n_5[i21, i22] := 0.0;
  }
}
for i23 = 0 to 9 {
  for i24 = 0 to 15 {
    n_5[i23, 0] := (n_5[i23, 0] + (w3[0, i24] * h2[i23, i24]));
  }
}
for i25 = 0 to 9 {
  mlp[i25, 0] := (b3[0] + n_5[i25, 0]);
}
for i26 = 0 to 9 {
  n_6[i26, 0] := (moons_class[i26, 0] * mlp[i26, 0]);
}
for i27 = 0 to 0 {
  n1[i27] := 1.0;
}
for i28 = 0 to 9 {
  n_7[i28, 0] := (n1[0] - n_6[i28, 0]);
}
for i29 = 0 to 9 {
  margin_loss[i29, 0] := relu(n_7[i29, 0]);
}
for i30 = 0 to 0 {
  sum[i30] := 0.0;
}
for i31 = 0 to 9 {
  sum[0] := (sum[0] + margin_loss[i31, 0]);
}
for i32 = 0 to 0 {
  n10[i32] := 10.0;
}
scalar_loss[0] := (sum[0] / n10[0]);
/* zero gradients */
for i33 = 0 to 15 {
  b1_grad[i33] := 0.0;
}
for i34 = 0 to 15 {
  for i35 = 0 to 1 {
    w1_grad[i34, i35] := 0.0;
  }
}
for i36 = 0 to 9 {
  for i37 = 0 to 15 {
    grad[i36, i37] := 0.0;
  }
}
for i38 = 0 to 9 {
  for i39 = 0 to 15 {
    grad_2[i38, i39] := 0.0;
  }
}
for i40 = 0 to 9 {
  for i41 = 0 to 15 {
    h1_grad[i40, i41] := 0.0;
  }
}
for i42 = 0 to 15 {
  b2_grad[i42] := 0.0;
}
for i43 = 0 to 15 {
  for i44 = 0 to 15 {
    w2_grad[i43, i44] := 0.0;
  }
}
for i45 = 0 to 9 {
  for i46 = 0 to 15 {
    grad_3[i45, i46] := 0.0;
  }
}
for i47 = 0 to 9 {
  for i48 = 0 to 15 {
    grad_4[i47, i48] := 0.0;
  }
}
for i49 = 0 to 9 {
  for i50 = 0 to 15 {
    h2_grad[i49, i50] := 0.0;
  }
}
for i51 = 0 to 0 {
  b3_grad[i51] := 0.0;
}
for i52 = 0 to 0 {
  for i53 = 0 to 15 {
    w3_grad[i52, i53] := 0.0;
  }
}
for i54 = 0 to 9 {
  for i55 = 0 to 0 {
    grad_5[i54, i55] := 0.0;
  }
}
for i56 = 0 to 9 {
  for i57 = 0 to 0 {
    mlp_grad[i56, i57] := 0.0;
  }
}
for i58 = 0 to 9 {
  for i59 = 0 to 0 {
    grad_6[i58, i59] := 0.0;
  }
}
for i60 = 0 to 9 {
  for i61 = 0 to 0 {
    grad_7[i60, i61] := 0.0;
  }
}
for i62 = 0 to 9 {
  for i63 = 0 to 0 {
    margin_loss_grad[i62, i63] := 0.0;
  }
}
for i64 = 0 to 0 {
  sum_grad[i64] := 0.0;
}
for i65 = 0 to 0 {
  scalar_loss_grad[i65] := 0.0;
}
/* backprop scalar_loss */
for i66 = 0 to 0 {
  scalar_loss_grad[i66] := 1.0;
}
sum_grad[0] := (sum_grad[0] + (scalar_loss_grad[0] / n10[0]));
for i67 = 0 to 9 {
  margin_loss_grad[i67, 0] := (margin_loss_grad[i67, 0] + sum_grad[0]);
}
for i68 = 0 to 9 {
  grad_7[i68, 0] := (grad_7[i68, 0] + (margin_loss[i68, 0] -?/ margin_loss_grad[i68, 0]));
}
for i69 = 0 to 9 {
  grad_6[i69, 0] := (grad_6[i69, 0] - grad_7[i69, 0]);
}
for i70 = 0 to 9 {
  mlp_grad[i70, 0] := (mlp_grad[i70, 0] + (moons_class[i70, 0] * grad_6[i70, 0]));
}
for i71 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i71, 0]);
}
for i72 = 0 to 9 {
  grad_5[i72, 0] := (grad_5[i72, 0] + mlp_grad[i72, 0]);
}
for i73 = 0 to 9 {
  for i74 = 0 to 15 {
    w3_grad[0, i74] := (w3_grad[0, i74] + (grad_5[i73, 0] * h2[i73, i74]));
  }
}
for i75 = 0 to 9 {
  for i76 = 0 to 15 {
    h2_grad[i75, i76] := (h2_grad[i75, i76] + (w3[0, i76] * grad_5[i75, 0]));
  }
}
for i77 = 0 to 9 {
  for i78 = 0 to 15 {
    grad_4[i77, i78] := (grad_4[i77, i78] + (h2[i77, i78] -?/ h2_grad[i77, i78]));
  }
}
for i79 = 0 to 9 {
  for i80 = 0 to 15 {
    b2_grad[i80] := (b2_grad[i80] + grad_4[i79, i80]);
  }
}
for i81 = 0 to 9 {
  for i82 = 0 to 15 {
    grad_3[i81, i82] := (grad_3[i81, i82] + grad_4[i81, i82]);
  }
}
for i83 = 0 to 9 {
  for i84 = 0 to 15 {
    for i85 = 0 to 15 {
      w2_grad[i84, i85] := (w2_grad[i84, i85] + (grad_3[i83, i84] * h1[i83, i85]));
    }
  }
}
for i86 = 0 to 9 {
  for i87 = 0 to 15 {
    for i88 = 0 to 15 {
      h1_grad[i86, i88] := (h1_grad[i86, i88] + (w2[i87, i88] * grad_3[i86, i87]));
    }
  }
}
for i89 = 0 to 9 {
  for i90 = 0 to 15 {
    grad_2[i89, i90] := (grad_2[i89, i90] + (h1[i89, i90] -?/ h1_grad[i89, i90]));
  }
}
for i91 = 0 to 9 {
  for i92 = 0 to 15 {
    b1_grad[i92] := (b1_grad[i92] + grad_2[i91, i92]);
  }
}
for i93 = 0 to 9 {
  for i94 = 0 to 15 {
    grad[i93, i94] := (grad[i93, i94] + grad_2[i93, i94]);
  }
}
for i95 = 0 to 9 {
  for i96 = 0 to 15 {
    for i97 = 0 to 1 {
      w1_grad[i96, i97] := (w1_grad[i96, i97] + (grad[i95, i96] * moons_input[i95, i97]));
    }
  }
}
/* sgd b1 */
for i98 = 0 to 0 {
  n0_0001[i98] := 0.0001;
}
for i99 = 0 to 15 {
  mul[i99] := (n0_0001[0] * b1[i99]);
}
for i100 = 0 to 15 {
  sgd_delta[i100] := (b1_grad[i100] + mul[i100]);
}
for i101 = 0 to 0 {
  embed_step[i101] := (step0);
}
for i102 = 0 to 0 {
  n80[i102] := 80.0;
}
n_8[0] := (n80[0] - embed_step[0]);
for i103 = 0 to 0 {
  n40[i103] := 40.0;
}
n_9[0] := (n_8[0] / n40[0]);
for i104 = 0 to 0 {
  n0_1[i104] := 0.1;
}
learning_rate[0] := (n0_1[0] * n_9[0]);
for i105 = 0 to 15 {
  b1[i105] := (b1[i105] - (learning_rate[0] * sgd_delta[i105]));
}
/* sgd w1 */
for i106 = 0 to 0 {
  n0_0001_2[i106] := 0.0001;
}
for i107 = 0 to 15 {
  for i108 = 0 to 1 {
    mul_2[i107, i108] := (n0_0001_2[0] * w1[i107, i108]);
  }
}
for i109 = 0 to 15 {
  for i110 = 0 to 1 {
    sgd_delta_2[i109, i110] := (w1_grad[i109, i110] + mul_2[i109, i110]);
  }
}
for i111 = 0 to 15 {
  for i112 = 0 to 1 {
    w1[i111, i112] := (w1[i111, i112] - (learning_rate[0] * sgd_delta_2[i111, i112]));
  }
}
/* sgd b2 */
for i113 = 0 to 0 {
  n0_0001_3[i113] := 0.0001;
}
for i114 = 0 to 15 {
  mul_3[i114] := (n0_0001_3[0] * b2[i114]);
}
for i115 = 0 to 15 {
  sgd_delta_3[i115] := (b2_grad[i115] + mul_3[i115]);
}
for i116 = 0 to 15 {
  b2[i116] := (b2[i116] - (learning_rate[0] * sgd_delta_3[i116]));
}
/* sgd w2 */
for i117 = 0 to 0 {
  n0_0001_4[i117] := 0.0001;
}
for i118 = 0 to 15 {
  for i119 = 0 to 15 {
    mul_4[i118, i119] := (n0_0001_4[0] * w2[i118, i119]);
  }
}
for i120 = 0 to 15 {
  for i121 = 0 to 15 {
    sgd_delta_4[i120, i121] := (w2_grad[i120, i121] + mul_4[i120, i121]);
  }
}
for i122 = 0 to 15 {
  for i123 = 0 to 15 {
    w2[i122, i123] := (w2[i122, i123] - (learning_rate[0] * sgd_delta_4[i122, i123]));
  }
}
/* sgd b3 */
for i124 = 0 to 0 {
  n0_0001_5[i124] := 0.0001;
}
mul_5[0] := (n0_0001_5[0] * b3[0]);
sgd_delta_5[0] := (b3_grad[0] + mul_5[0]);
b3[0] := (b3[0] - (learning_rate[0] * sgd_delta_5[0]));
/* sgd w3 */
for i125 = 0 to 0 {
  n0_0001_6[i125] := 0.0001;
}
for i126 = 0 to 15 {
  mul_6[0, i126] := (n0_0001_6[0] * w3[0, i126]);
}
for i127 = 0 to 15 {
  sgd_delta_6[0, i127] := (w3_grad[0, i127] + mul_6[0, i127]);
}
for i128 = 0 to 15 {
  w3[0, i128] := (w3[0, i128] - (learning_rate[0] * sgd_delta_6[0, i128]));
}
