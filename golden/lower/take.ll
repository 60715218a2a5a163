take ():
  for i0 = 0 to 1 {
    for i1 = 0 to 1 {
      for i2 = 0 to 2 { emb[i0, i1, i2] := table[@(int32(ids[i0, i1])), i2]; }
    }
  }
  for i3 = 0 to 1 {
    for i4 = 0 to 1 {
      for i5 = 0 to 2 {
        table_grad[@(int32(ids[i3, i4])), i5] := (table_grad[@(int32(ids[i3, i4])), i5] + emb_grad[i3, i4, i5]);
      }
    }
  }
