take ():
  for i0 = 0 to 1 {
    for i1 = 0 to 1 {
      for i2 = 0 to 2 {
        emb[i0, i1, i2] := table[@(where(((ids[i0, i1] > -1.0) && (ids[i0, i1] < 2147483648.0)), int32(ids[i0, i1]), -1)), i2];
      }
    }
  }
  for i3 = 0 to 1 {
    for i4 = 0 to 1 {
      for i5 = 0 to 2 {
        table_grad[@(where(((ids[i3, i4] > -1.0) && (ids[i3, i4] < 2147483648.0)), int32(ids[i3, i4]), -1)), i5] := (table_grad[@(where(((ids[i3, i4] > -1.0) && (ids[i3, i4] < 2147483648.0)), int32(ids[i3, i4]), -1)), i5] + emb_grad[i3, i4, i5]);
      }
    }
  }
