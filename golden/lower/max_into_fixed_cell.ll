max_into_fixed_cell ():
  fill m := -inf;
  for i0 = 0 to 3 { m[0] := max(m[0], x[i0]); }
