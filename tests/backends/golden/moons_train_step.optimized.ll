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
for i21 = 0 to 9 {
  for i22 = 0 to 0 {
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
for i30 = 0 to 0 {
  sum[i30] := 0.0;
}
for i31 = 0 to 9 {
  sum[0] := (sum[0] + margin_loss[i31, 0]);
}
scalar_loss[0] := (sum[0] / 10.0);
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
sum_grad[0] := (sum_grad[0] + (scalar_loss_grad[0] / 10.0));
for i70 = 0 to 9 {
  mlp_grad[i70, 0] := fma(moons_classes[batch0, i70, 0], neg((margin_loss[i70, 0] -?/ sum_grad[0])), mlp_grad[i70, 0]);
}
for i71 = 0 to 9 {
  b3_grad[0] := (b3_grad[0] + mlp_grad[i71, 0]);
}
for i72 = 0 to 9 {
  grad_5[i72, 0] := (grad_5[i72, 0] + mlp_grad[i72, 0]);
}
for i73 = 0 to 9 {
  for i74 = 0 to 15 {
    w3_grad[0, i74] := fma(grad_5[i73, 0], h2[i73, i74], w3_grad[0, i74]);
  }
}
for i77 = 0 to 9 {
  for i78 = 0 to 15 {
    grad_4[i77, i78] := (grad_4[i77, i78] + (h2[i77, i78] -?/ fma(w3[0, i78], grad_5[i77, 0], 0.0)));
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
      w2_grad[i84, i85] := fma(grad_3[i83, i84], h1[i83, i85], w2_grad[i84, i85]);
    }
  }
}
for i86 = 0 to 9 {
  for i87 = 0 to 15 {
    for i88 = 0 to 15 {
      h1_grad[i86, i88] := fma(w2[i87, i88], grad_3[i86, i87], h1_grad[i86, i88]);
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
      w1_grad[i96, i97] := fma(grad[i95, i96], moons_flat[batch0, i95, i97], w1_grad[i96, i97]);
    }
  }
}
/* sgd b1 */
learning_rate[0] := (0.1 * ((80.0 - (step0)) / 40.0));
for i105 = 0 to 15 {
  b1[i105] := (b1[i105] - (learning_rate[0] * fma(0.0001, b1[i105], b1_grad[i105])));
}
/* sgd w1 */
for i111 = 0 to 15 {
  for i112 = 0 to 1 {
    w1[i111, i112] := (w1[i111, i112] - (learning_rate[0] * fma(0.0001, w1[i111, i112], w1_grad[i111, i112])));
  }
}
/* sgd b2 */
for i116 = 0 to 15 {
  b2[i116] := (b2[i116] - (learning_rate[0] * fma(0.0001, b2[i116], b2_grad[i116])));
}
/* sgd w2 */
for i122 = 0 to 15 {
  for i123 = 0 to 15 {
    w2[i122, i123] := (w2[i122, i123] - (learning_rate[0] * fma(0.0001, w2[i122, i123], w2_grad[i122, i123])));
  }
}
/* sgd b3 */
b3[0] := (b3[0] - (learning_rate[0] * fma(0.0001, b3[0], b3_grad[0])));
/* sgd w3 */
for i128 = 0 to 15 {
  w3[0, i128] := (w3[0, i128] - (learning_rate[0] * fma(0.0001, w3[0, i128], w3_grad[0, i128])));
}
