/* forward scalar_loss */
zero_out(n);
zero_out(n_3);
zero_out(n_5);
for i3 = 0 to 9 {
  for i4 = 0 to 15 {
    for i5 = 0 to 1 {
      n[i3, i4] := fma(w1[i4, i5], moons_flat[batch0, i3, i5], n[i3, i4]);
    }
  }
  for i9 = 0 to 15 {
    h1[i3, i9] := relu((b1[i9] + n[i3, i9]));
  }
  for i11 = 0 to 15 {
    for i12 = 0 to 15 {
      n_3[i3, i11] := fma(w2[i11, i12], h1[i3, i12], n_3[i3, i11]);
    }
  }
  for i16 = 0 to 15 {
    h2[i3, i16] := relu((b2[i16] + n_3[i3, i16]));
  }
  for i18 = 0 to 15 {
    n_5[i3, 0] := fma(w3[0, i18], h2[i3, i18], n_5[i3, 0]);
  }
}
for i23 = 0 to 9 {
  margin_loss[i23, 0] := relu((1.0 - (moons_classes[batch0, i23, 0] * (b3[0] + n_5[i23, 0]))));
}
scalar_loss[0] := ((v8 := 0;
  for i69 = 0 to 9 {
    v8 := (v8 + margin_loss[i69, 0]);
  }
  v8) / 10.0);
/* zero gradients */
zero_out(b1_grad);
zero_out(w1_grad);
zero_out(h1_grad);
zero_out(b2_grad);
zero_out(w2_grad);
zero_out(b3_grad);
zero_out(w3_grad);
/* backprop scalar_loss */
for i26 = 0 to 0 {
  scalar_loss_grad[i26] := 1.0;
}
for i30 = 0 to 9 {
  mlp_grad[i30, 0] := (moons_classes[batch0, i30, 0] * (0.0 - (margin_loss[i30, 0] -?/ (scalar_loss_grad[0] / 10.0))));
}
for i31 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i31, 0]);
}
for i32 = 0 to 9 {
  grad_5[i32, 0] := mlp_grad[i32, 0];
}
for i33 = 0 to 9 {
  for i34 = 0 to 15 {
    w3_grad[0, i34] := fma(grad_5[i33, 0], h2[i33, i34], w3_grad[0, i34]);
  }
  for i38 = 0 to 15 {
    row[i38] := (h2[i33, i38] -?/ fma(w3[0, i38], grad_5[i33, 0], 0.0));
  }
  for i40 = 0 to 15 {
    b2_grad[i40] := (b2_grad[i40] + row[i40]);
  }
  for i44 = 0 to 15 {
    for i45 = 0 to 15 {
      w2_grad[i44, i45] := fma(row[i44], h1[i33, i45], w2_grad[i44, i45]);
      h1_grad[i33, i45] := fma(w2[i44, i45], row[i44], h1_grad[i33, i45]);
    }
  }
  for i50 = 0 to 15 {
    row_2[i50] := (h1[i33, i50] -?/ h1_grad[i33, i50]);
  }
  for i52 = 0 to 15 {
    b1_grad[i52] := (b1_grad[i52] + row_2[i52]);
  }
  for i56 = 0 to 15 {
    for i57 = 0 to 1 {
      w1_grad[i56, i57] := fma(row_2[i56], moons_flat[batch0, i33, i57], w1_grad[i56, i57]);
    }
  }
}
/* sgd b1 */
learning_rate[0] := (0.1 * ((80.0 - (step0)) / 40.0));
for i62 = 0 to 15 {
  b1[i62] := (b1[i62] - (learning_rate[0] * fma(0.0001, b1[i62], b1_grad[i62])));
}
/* sgd w1 */
for i63 = 0 to 15 {
  for i64 = 0 to 1 {
    w1[i63, i64] := (w1[i63, i64] - (learning_rate[0] * fma(0.0001, w1[i63, i64], w1_grad[i63, i64])));
  }
}
/* sgd b2 */
for i65 = 0 to 15 {
  b2[i65] := (b2[i65] - (learning_rate[0] * fma(0.0001, b2[i65], b2_grad[i65])));
}
/* sgd w2 */
for i66 = 0 to 15 {
  for i67 = 0 to 15 {
    w2[i66, i67] := (w2[i66, i67] - (learning_rate[0] * fma(0.0001, w2[i66, i67], w2_grad[i66, i67])));
  }
}
/* sgd b3 */
b3[0] := (b3[0] - (learning_rate[0] * fma(0.0001, b3[0], b3_grad[0])));
/* sgd w3 */
for i68 = 0 to 15 {
  w3[0, i68] := (w3[0, i68] - (learning_rate[0] * fma(0.0001, w3[0, i68], w3_grad[0, i68])));
}
