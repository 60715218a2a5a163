add_fwd ():
  /* add forward */
  for i0 = 0 to 1 {
    for i1 = 0 to 2 { add[i0, i1] := (x[i0, i1] + b[0, i1]); }
  }
  for i2 = 0 to 1 {
    for i3 = 0 to 2 { add_4[i2, i3] := (add[i2, i3] + c[0]); }
  }
