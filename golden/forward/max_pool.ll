pool_fwd ():
  /* pool forward */
  for i0 = 0 to 1 {
    for i1 = 0 to 1 {
      pool[i0, i1, 0] := -inf;
      for i2 = 0 to 1 {
        for i3 = 0 to 1 {
          pool[i0, i1, 0] := max(pool[i0, i1, 0], (x[2*i0+i2, 2*i1+i3, 0] + window[i2, i3]));
        }
      }
    }
  }
