matvec ():
  for i0 = 0 to 2 {
    c[i0] := 0.0;
    for i1 = 0 to 3 { c[i0] := (c[i0] + (a[i0, i1] * v[i1])); }
  }
