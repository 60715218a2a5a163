conv_fwd ():
  /* conv forward */
  for i0 = 0 to 1 {
    for i1 = 0 to 2 {
      for i2 = 0 to 2 {
        for i3 = 0 to 3 {
          conv[i0, i1, i2, i3] := 0.0;
          for i4 = 0 to 2 {
            for i5 = 0 to 2 {
              conv[i0, i1, i2, i3] := (conv[i0, i1, i2, i3] + (images[i0, 2*i1+i4-1, 2*i2+i5-1, 0 else 0.0] * kernel_3[i3, i4, i5, 0]));
            }
          }
        }
      }
    }
  }
