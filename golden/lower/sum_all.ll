sum_all ():
  s[] := 0.0;
  for i0 = 0 to 1 {
    for i1 = 0 to 2 { s[] := (s[] + x[i0, i1]); }
  }
