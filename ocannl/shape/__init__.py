"""Shape inference: einsum specs, shapes made of rows of dims, the constraint solver, projections."""
