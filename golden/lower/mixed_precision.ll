mixed_precision ():
  for i0 = 0 to 1 { h[i0] := (b[i0] * 3.0); }
  for i1 = 0 to 1 { y[i1] := (int32(h[i1]) / 2); }
