"""cuvil_pgc.viewer (see DESIGN.md for this stage's contract)."""
