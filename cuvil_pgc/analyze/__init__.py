"""cuvil_pgc.analyze (see DESIGN.md for this stage's contract)."""
