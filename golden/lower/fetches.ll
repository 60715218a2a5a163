fetches (batch_n : [0..3]):
  /* fetches */
  fill r := 0.5;
  for i0 = 0 to 1 {
    for i1 = 0 to 2 { r[i0, i1] := float32(3*i0+i1); }
  }
  for i2 = 0 to 1 {
    for i3 = 0 to 2 { x[i2, i3] := xs[batch_n, i2, i3]; }
  }
  for i4 = 0 to 1 { e[i4] := float32(batch_n); }
  v[0, 0] := 1.0;
  v[0, 1] := 2.0;
  v[1, 0] := 3.0;
  v[1, 1] := 1.0;
