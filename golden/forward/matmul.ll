compose_fwd ():
  /* compose forward */
  for i0 = 0 to 1 {
    for i1 = 0 to 2 {
      compose[i0, i1] := 0.0;
      for i2 = 0 to 3 { compose[i0, i1] := (compose[i0, i1] + (w[i1, i2] * x[i0, i2])); }
    }
  }
