/* forward scalar_loss */
for i3 = 0 to 9 {
  for i4 = 0 to 15 {
    n[i3, i4] := 0.0;
  }
}
for i5 = 0 to 9 {
  for i6 = 0 to 15 {
    for i7 = 0 to 1 {
      n[i5, i6] := fma(w1[i6, i7], moons_flat[batch0, i5, i7], n[i5, i6]);
    }
  }
}
for i10 = 0 to 9 {
  for i11 = 0 to 15 {
    h1[i10, i11] := relu((b1[i11] + n[i10, i11]));
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
      n_3[i14, i15] := fma(w2[i15, i16], h1[i14, i16], n_3[i14, i15]);
    }
  }
}
for i19 = 0 to 9 {
  for i20 = 0 to 15 {
    h2[i19, i20] := relu((b2[i20] + n_3[i19, i20]));
  }
}
for i22 = 0 to 0 {
  for i21 = 0 to 9 {
    n_5[i21, i22] := 0.0;
  }
}
for i23 = 0 to 9 {
  for i24 = 0 to 15 {
    n_5[i23, 0] := fma(w3[0, i24], h2[i23, i24], n_5[i23, 0]);
  }
}
for i29 = 0 to 9 {
  margin_loss[i29, 0] := relu((1.0 - (moons_classes[batch0, i29, 0] * (b3[0] + n_5[i29, 0]))));
}
scalar_loss[0] := ((v8 := 0;
  for i96 = 0 to 9 {
    v8 := (v8 + margin_loss[i96, 0]);
  }
  v8) / 10.0);
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
zero_out(b3_grad);
zero_out(w3_grad);
zero_out(grad_5);
zero_out(mlp_grad);
zero_out(scalar_loss_grad);
/* backprop scalar_loss */
for i33 = 0 to 0 {
  scalar_loss_grad[i33] := 1.0;
}
for i37 = 0 to 9 {
  mlp_grad[i37, 0] := fma(moons_classes[batch0, i37, 0], neg((margin_loss[i37, 0] -?/ (scalar_loss_grad[0] / 10.0))), mlp_grad[i37, 0]);
}
for i38 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i38, 0]);
}
for i39 = 0 to 9 {
  grad_5[i39, 0] := (grad_5[i39, 0] + mlp_grad[i39, 0]);
}
for i40 = 0 to 9 {
  for i41 = 0 to 15 {
    w3_grad[0, i41] := fma(grad_5[i40, 0], h2[i40, i41], w3_grad[0, i41]);
  }
}
for i44 = 0 to 9 {
  for i45 = 0 to 15 {
    grad_4[i44, i45] := (grad_4[i44, i45] + (h2[i44, i45] -?/ fma(w3[0, i45], grad_5[i44, 0], 0.0)));
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
      w2_grad[i51, i52] := fma(grad_3[i50, i51], h1[i50, i52], w2_grad[i51, i52]);
    }
  }
}
for i53 = 0 to 9 {
  for i54 = 0 to 15 {
    for i55 = 0 to 15 {
      h1_grad[i53, i55] := fma(w2[i54, i55], grad_3[i53, i54], h1_grad[i53, i55]);
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
      w1_grad[i63, i64] := fma(grad[i62, i63], moons_flat[batch0, i62, i64], w1_grad[i63, i64]);
    }
  }
}
/* sgd b1 */
learning_rate[0] := (0.1 * ((80.0 - (step0)) / 40.0));
for i72 = 0 to 15 {
  b1[i72] := (b1[i72] - (learning_rate[0] * fma(0.0001, b1[i72], b1_grad[i72])));
}
/* sgd w1 */
for i78 = 0 to 15 {
  for i79 = 0 to 1 {
    w1[i78, i79] := (w1[i78, i79] - (learning_rate[0] * fma(0.0001, w1[i78, i79], w1_grad[i78, i79])));
  }
}
/* sgd b2 */
for i83 = 0 to 15 {
  b2[i83] := (b2[i83] - (learning_rate[0] * fma(0.0001, b2[i83], b2_grad[i83])));
}
/* sgd w2 */
for i89 = 0 to 15 {
  for i90 = 0 to 15 {
    w2[i89, i90] := (w2[i89, i90] - (learning_rate[0] * fma(0.0001, w2[i89, i90], w2_grad[i89, i90])));
  }
}
/* sgd b3 */
b3[0] := (b3[0] - (learning_rate[0] * fma(0.0001, b3[0], b3_grad[0])));
/* sgd w3 */
for i95 = 0 to 15 {
  w3[0, i95] := (w3[0, i95] - (learning_rate[0] * fma(0.0001, w3[0, i95], w3_grad[0, i95])));
}
