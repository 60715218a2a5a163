max_rows ():
  for i0 = 0 to 1 {
    m[i0] := -inf;
    for i1 = 0 to 2 { m[i0] := max(m[i0], x[i0, i1]); }
  }
