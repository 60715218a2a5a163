reduction_outermost ():
  fill c := 0.0;
  for i0 = 0 to 3 {
    for i1 = 0 to 2 { c[i1] := (c[i1] + (a[i1, i0] * v[i0])); }
  }
