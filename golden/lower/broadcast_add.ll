broadcast_add ():
  for i0 = 0 to 1 {
    for i1 = 0 to 2 { y[i0, i1] := (x[i0, i1] + b[0, i1]); }
  }
