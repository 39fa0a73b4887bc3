/* forward scalar_loss */
for i0 = 0 to 9 {
  for i1 = 0 to 1 {
    moons_input[i0, i1] := moons_flat[batch0, i0, i1];
  }
}
for i2 = 0 to 9 {
  moons_class[i2, 0] := moons_classes[batch0, i2, 0];
}
zero_out(n);
for i3 = 0 to 9 {
  for i4 = 0 to 15 {
    for i5 = 0 to 1 {
      n[i3, i4] := (n[i3, i4] + (w1[i4, i5] * moons_input[i3, i5]));
    }
  }
}
for i6 = 0 to 9 {
  for i7 = 0 to 15 {
    n_2[i6, i7] := (b1[i7] + n[i6, i7]);
  }
}
for i8 = 0 to 9 {
  for i9 = 0 to 15 {
    h1[i8, i9] := relu(n_2[i8, i9]);
  }
}
zero_out(n_3);
for i10 = 0 to 9 {
  for i11 = 0 to 15 {
    for i12 = 0 to 15 {
      n_3[i10, i11] := (n_3[i10, i11] + (w2[i11, i12] * h1[i10, i12]));
    }
  }
}
for i13 = 0 to 9 {
  for i14 = 0 to 15 {
    n_4[i13, i14] := (b2[i14] + n_3[i13, i14]);
  }
}
for i15 = 0 to 9 {
  for i16 = 0 to 15 {
    h2[i15, i16] := relu(n_4[i15, i16]);
  }
}
zero_out(n_5);
for i17 = 0 to 9 {
  for i18 = 0 to 15 {
    n_5[i17, 0] := (n_5[i17, 0] + (w3[0, i18] * h2[i17, i18]));
  }
}
for i19 = 0 to 9 {
  mlp[i19, 0] := (b3[0] + n_5[i19, 0]);
}
for i20 = 0 to 9 {
  n_6[i20, 0] := (moons_class[i20, 0] * mlp[i20, 0]);
}
for i21 = 0 to 0 {
  n1[i21] := 1.0;
}
for i22 = 0 to 9 {
  n_7[i22, 0] := (n1[0] - n_6[i22, 0]);
}
for i23 = 0 to 9 {
  margin_loss[i23, 0] := relu(n_7[i23, 0]);
}
zero_out(sum);
for i24 = 0 to 9 {
  sum[0] := (sum[0] + margin_loss[i24, 0]);
}
for i25 = 0 to 0 {
  n10[i25] := 10.0;
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
for i26 = 0 to 0 {
  scalar_loss_grad[i26] := 1.0;
}
sum_grad[0] := (sum_grad[0] + (scalar_loss_grad[0] / n10[0]));
for i27 = 0 to 9 {
  margin_loss_grad[i27, 0] := (margin_loss_grad[i27, 0] + sum_grad[0]);
}
for i28 = 0 to 9 {
  grad_7[i28, 0] := (grad_7[i28, 0] + (margin_loss[i28, 0] -?/ margin_loss_grad[i28, 0]));
}
for i29 = 0 to 9 {
  grad_6[i29, 0] := (grad_6[i29, 0] - grad_7[i29, 0]);
}
for i30 = 0 to 9 {
  mlp_grad[i30, 0] := (mlp_grad[i30, 0] + (moons_class[i30, 0] * grad_6[i30, 0]));
}
for i31 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i31, 0]);
}
for i32 = 0 to 9 {
  grad_5[i32, 0] := (grad_5[i32, 0] + mlp_grad[i32, 0]);
}
for i33 = 0 to 9 {
  for i34 = 0 to 15 {
    w3_grad[0, i34] := (w3_grad[0, i34] + (grad_5[i33, 0] * h2[i33, i34]));
  }
}
for i35 = 0 to 9 {
  for i36 = 0 to 15 {
    h2_grad[i35, i36] := (h2_grad[i35, i36] + (w3[0, i36] * grad_5[i35, 0]));
  }
}
for i37 = 0 to 9 {
  for i38 = 0 to 15 {
    grad_4[i37, i38] := (grad_4[i37, i38] + (h2[i37, i38] -?/ h2_grad[i37, i38]));
  }
}
for i39 = 0 to 9 {
  for i40 = 0 to 15 {
    b2_grad[i40] := (b2_grad[i40] + grad_4[i39, i40]);
  }
}
for i41 = 0 to 9 {
  for i42 = 0 to 15 {
    grad_3[i41, i42] := (grad_3[i41, i42] + grad_4[i41, i42]);
  }
}
for i43 = 0 to 9 {
  for i44 = 0 to 15 {
    for i45 = 0 to 15 {
      w2_grad[i44, i45] := (w2_grad[i44, i45] + (grad_3[i43, i44] * h1[i43, i45]));
    }
  }
}
for i46 = 0 to 9 {
  for i47 = 0 to 15 {
    for i48 = 0 to 15 {
      h1_grad[i46, i48] := (h1_grad[i46, i48] + (w2[i47, i48] * grad_3[i46, i47]));
    }
  }
}
for i49 = 0 to 9 {
  for i50 = 0 to 15 {
    grad_2[i49, i50] := (grad_2[i49, i50] + (h1[i49, i50] -?/ h1_grad[i49, i50]));
  }
}
for i51 = 0 to 9 {
  for i52 = 0 to 15 {
    b1_grad[i52] := (b1_grad[i52] + grad_2[i51, i52]);
  }
}
for i53 = 0 to 9 {
  for i54 = 0 to 15 {
    grad[i53, i54] := (grad[i53, i54] + grad_2[i53, i54]);
  }
}
for i55 = 0 to 9 {
  for i56 = 0 to 15 {
    for i57 = 0 to 1 {
      w1_grad[i56, i57] := (w1_grad[i56, i57] + (grad[i55, i56] * moons_input[i55, i57]));
    }
  }
}
/* sgd b1 */
for i58 = 0 to 0 {
  embed_step[i58] := (step0);
}
for i59 = 0 to 0 {
  n80[i59] := 80.0;
}
n_8[0] := (n80[0] - embed_step[0]);
for i60 = 0 to 0 {
  n40[i60] := 40.0;
}
n_9[0] := (n_8[0] / n40[0]);
for i61 = 0 to 0 {
  n0_1[i61] := 0.1;
}
learning_rate[0] := (n0_1[0] * n_9[0]);
for i62 = 0 to 15 {
  b1[i62] := (b1[i62] - (learning_rate[0] * (b1_grad[i62] + (0.0001 * b1[i62]))));
}
/* sgd w1 */
for i63 = 0 to 15 {
  for i64 = 0 to 1 {
    w1[i63, i64] := (w1[i63, i64] - (learning_rate[0] * (w1_grad[i63, i64] + (0.0001 * w1[i63, i64]))));
  }
}
/* sgd b2 */
for i65 = 0 to 15 {
  b2[i65] := (b2[i65] - (learning_rate[0] * (b2_grad[i65] + (0.0001 * b2[i65]))));
}
/* sgd w2 */
for i66 = 0 to 15 {
  for i67 = 0 to 15 {
    w2[i66, i67] := (w2[i66, i67] - (learning_rate[0] * (w2_grad[i66, i67] + (0.0001 * w2[i66, i67]))));
  }
}
/* sgd b3 */
b3[0] := (b3[0] - (learning_rate[0] * (b3_grad[0] + (0.0001 * b3[0]))));
/* sgd w3 */
for i68 = 0 to 15 {
  w3[0, i68] := (w3[0, i68] - (learning_rate[0] * (w3_grad[0, i68] + (0.0001 * w3[0, i68]))));
}
