reduced_fwd ():
  /* reduced forward */
  for i0 = 0 to 1 {
    for i1 = 0 to 2 {
      reduced[i0, i1] := 0.0;
      for i2 = 0 to 3 { reduced[i0, i1] := (reduced[i0, i1] + x[i0, i2, i1]); }
    }
  }
