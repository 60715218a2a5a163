pointwise_neutral ():
  for i0 = 0 to 2 { y[i0] := exp(x[i0]); }
