conv1d_stride2_padded ():
  for i0 = 0 to 3 {
    y[i0] := 0.0;
    for i1 = 0 to 2 { y[i0] := (y[i0] + (x[2*i0+i1-1 else 0.0] * w[i1])); }
  }
