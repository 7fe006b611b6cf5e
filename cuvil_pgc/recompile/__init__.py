"""cuvil_pgc.recompile (see DESIGN.md for this stage's contract)."""
