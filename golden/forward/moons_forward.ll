scalar_loss_fwd (batch_n : [0..79]):
  /* scalar_loss forward */
  for i0 = 0 to 9 {
    for i1 = 0 to 1 { moons_flat_batch_n[i0, i1] := moons_flat[batch_n, i0, i1]; }
  }
  for i2 = 0 to 9 { moons_classes_batch_n[i2, 0] := moons_classes[batch_n, i2, 0]; }
  for i3 = 0 to 9 {
    for i4 = 0 to 15 {
      compose[i3, i4] := 0.0;
      for i5 = 0 to 1 {
        compose[i3, i4] := (compose[i3, i4] + (w1[i4, i5] * moons_flat_batch_n[i3, i5]));
      }
    }
  }
  for i6 = 0 to 9 {
    for i7 = 0 to 15 { add[i6, i7] := (compose[i6, i7] + b1[i7]); }
  }
  for i8 = 0 to 9 {
    for i9 = 0 to 15 { relu[i8, i9] := relu(add[i8, i9]); }
  }
  for i10 = 0 to 9 {
    for i11 = 0 to 15 {
      compose_10[i10, i11] := 0.0;
      for i12 = 0 to 15 {
        compose_10[i10, i11] := (compose_10[i10, i11] + (w2[i11, i12] * relu[i10, i12]));
      }
    }
  }
  for i13 = 0 to 9 {
    for i14 = 0 to 15 { add_12[i13, i14] := (compose_10[i13, i14] + b2[i14]); }
  }
  for i15 = 0 to 9 {
    for i16 = 0 to 15 { relu_14[i15, i16] := relu(add_12[i15, i16]); }
  }
  for i17 = 0 to 9 {
    compose_15[i17, 0] := 0.0;
    for i18 = 0 to 15 {
      compose_15[i17, 0] := (compose_15[i17, 0] + (w3[0, i18] * relu_14[i17, i18]));
    }
  }
  for i19 = 0 to 9 { mul[i19, 0] := (moons_classes_batch_n[i19, 0] * compose_15[i19, 0]); }
  for i20 = 0 to 9 { sub[i20, 0] := (1.0 - mul[i20, 0]); }
  for i21 = 0 to 9 { relu_19[i21, 0] := relu(sub[i21, 0]); }
  scalar_loss[] := 0.0;
  for i22 = 0 to 9 { scalar_loss[] := (scalar_loss[] + relu_19[i22, 0]); }
  scalar_loss[] := (scalar_loss[] * 0.1);
