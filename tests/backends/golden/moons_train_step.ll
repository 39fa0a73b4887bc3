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
zero_out(b1_grad);
zero_out(w1_grad);
zero_out(grad);
zero_out(grad_2);
zero_out(h1_grad);
zero_out(b2_grad);
zero_out(w2_grad);
zero_out(grad_3);
zero_out(grad_4);
zero_out(h2_grad);
zero_out(b3_grad);
zero_out(w3_grad);
zero_out(grad_5);
zero_out(mlp_grad);
zero_out(grad_6);
zero_out(grad_7);
zero_out(margin_loss_grad);
zero_out(sum_grad);
zero_out(scalar_loss_grad);
/* backprop scalar_loss */
for i33 = 0 to 0 {
  scalar_loss_grad[i33] := 1.0;
}
sum_grad[0] := (sum_grad[0] + (scalar_loss_grad[0] / n10[0]));
for i34 = 0 to 9 {
  margin_loss_grad[i34, 0] := (margin_loss_grad[i34, 0] + sum_grad[0]);
}
for i35 = 0 to 9 {
  grad_7[i35, 0] := (grad_7[i35, 0] + (margin_loss[i35, 0] -?/ margin_loss_grad[i35, 0]));
}
for i36 = 0 to 9 {
  grad_6[i36, 0] := (grad_6[i36, 0] - grad_7[i36, 0]);
}
for i37 = 0 to 9 {
  mlp_grad[i37, 0] := (mlp_grad[i37, 0] + (moons_class[i37, 0] * grad_6[i37, 0]));
}
for i38 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i38, 0]);
}
for i39 = 0 to 9 {
  grad_5[i39, 0] := (grad_5[i39, 0] + mlp_grad[i39, 0]);
}
for i40 = 0 to 9 {
  for i41 = 0 to 15 {
    w3_grad[0, i41] := (w3_grad[0, i41] + (grad_5[i40, 0] * h2[i40, i41]));
  }
}
for i42 = 0 to 9 {
  for i43 = 0 to 15 {
    h2_grad[i42, i43] := (h2_grad[i42, i43] + (w3[0, i43] * grad_5[i42, 0]));
  }
}
for i44 = 0 to 9 {
  for i45 = 0 to 15 {
    grad_4[i44, i45] := (grad_4[i44, i45] + (h2[i44, i45] -?/ h2_grad[i44, i45]));
  }
}
for i46 = 0 to 9 {
  for i47 = 0 to 15 {
    b2_grad[i47] := (b2_grad[i47] + grad_4[i46, i47]);
  }
}
for i48 = 0 to 9 {
  for i49 = 0 to 15 {
    grad_3[i48, i49] := (grad_3[i48, i49] + grad_4[i48, i49]);
  }
}
for i50 = 0 to 9 {
  for i51 = 0 to 15 {
    for i52 = 0 to 15 {
      w2_grad[i51, i52] := (w2_grad[i51, i52] + (grad_3[i50, i51] * h1[i50, i52]));
    }
  }
}
for i53 = 0 to 9 {
  for i54 = 0 to 15 {
    for i55 = 0 to 15 {
      h1_grad[i53, i55] := (h1_grad[i53, i55] + (w2[i54, i55] * grad_3[i53, i54]));
    }
  }
}
for i56 = 0 to 9 {
  for i57 = 0 to 15 {
    grad_2[i56, i57] := (grad_2[i56, i57] + (h1[i56, i57] -?/ h1_grad[i56, i57]));
  }
}
for i58 = 0 to 9 {
  for i59 = 0 to 15 {
    b1_grad[i59] := (b1_grad[i59] + grad_2[i58, i59]);
  }
}
for i60 = 0 to 9 {
  for i61 = 0 to 15 {
    grad[i60, i61] := (grad[i60, i61] + grad_2[i60, i61]);
  }
}
for i62 = 0 to 9 {
  for i63 = 0 to 15 {
    for i64 = 0 to 1 {
      w1_grad[i63, i64] := (w1_grad[i63, i64] + (grad[i62, i63] * moons_input[i62, i64]));
    }
  }
}
/* sgd b1 */
for i65 = 0 to 0 {
  n0_0001[i65] := 0.0001;
}
for i66 = 0 to 15 {
  mul[i66] := (n0_0001[0] * b1[i66]);
}
for i67 = 0 to 15 {
  sgd_delta_b1[i67] := (b1_grad[i67] + mul[i67]);
}
for i68 = 0 to 0 {
  embed_step[i68] := (step0);
}
for i69 = 0 to 0 {
  n80[i69] := 80.0;
}
n_8[0] := (n80[0] - embed_step[0]);
for i70 = 0 to 0 {
  n40[i70] := 40.0;
}
n_9[0] := (n_8[0] / n40[0]);
for i71 = 0 to 0 {
  n0_1[i71] := 0.1;
}
learning_rate[0] := (n0_1[0] * n_9[0]);
for i72 = 0 to 15 {
  b1[i72] := (b1[i72] - (learning_rate[0] * sgd_delta_b1[i72]));
}
/* sgd w1 */
for i73 = 0 to 0 {
  n0_0001_2[i73] := 0.0001;
}
for i74 = 0 to 15 {
  for i75 = 0 to 1 {
    mul_2[i74, i75] := (n0_0001_2[0] * w1[i74, i75]);
  }
}
for i76 = 0 to 15 {
  for i77 = 0 to 1 {
    sgd_delta_w1[i76, i77] := (w1_grad[i76, i77] + mul_2[i76, i77]);
  }
}
for i78 = 0 to 15 {
  for i79 = 0 to 1 {
    w1[i78, i79] := (w1[i78, i79] - (learning_rate[0] * sgd_delta_w1[i78, i79]));
  }
}
/* sgd b2 */
for i80 = 0 to 0 {
  n0_0001_3[i80] := 0.0001;
}
for i81 = 0 to 15 {
  mul_3[i81] := (n0_0001_3[0] * b2[i81]);
}
for i82 = 0 to 15 {
  sgd_delta_b2[i82] := (b2_grad[i82] + mul_3[i82]);
}
for i83 = 0 to 15 {
  b2[i83] := (b2[i83] - (learning_rate[0] * sgd_delta_b2[i83]));
}
/* sgd w2 */
for i84 = 0 to 0 {
  n0_0001_4[i84] := 0.0001;
}
for i85 = 0 to 15 {
  for i86 = 0 to 15 {
    mul_4[i85, i86] := (n0_0001_4[0] * w2[i85, i86]);
  }
}
for i87 = 0 to 15 {
  for i88 = 0 to 15 {
    sgd_delta_w2[i87, i88] := (w2_grad[i87, i88] + mul_4[i87, i88]);
  }
}
for i89 = 0 to 15 {
  for i90 = 0 to 15 {
    w2[i89, i90] := (w2[i89, i90] - (learning_rate[0] * sgd_delta_w2[i89, i90]));
  }
}
/* sgd b3 */
for i91 = 0 to 0 {
  n0_0001_5[i91] := 0.0001;
}
mul_5[0] := (n0_0001_5[0] * b3[0]);
sgd_delta_b3[0] := (b3_grad[0] + mul_5[0]);
b3[0] := (b3[0] - (learning_rate[0] * sgd_delta_b3[0]));
/* sgd w3 */
for i92 = 0 to 0 {
  n0_0001_6[i92] := 0.0001;
}
for i93 = 0 to 15 {
  mul_6[0, i93] := (n0_0001_6[0] * w3[0, i93]);
}
for i94 = 0 to 15 {
  sgd_delta_w3[0, i94] := (w3_grad[0, i94] + mul_6[0, i94]);
}
for i95 = 0 to 15 {
  w3[0, i95] := (w3[0, i95] - (learning_rate[0] * sgd_delta_w3[0, i95]));
}
