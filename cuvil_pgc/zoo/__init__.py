"""cuvil_pgc.zoo (see DESIGN.md for this stage's contract)."""
