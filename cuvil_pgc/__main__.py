"""`python -m cuvil_pgc` runs the `cuvil-pgc` command."""

from cuvil_pgc.cli import main

if __name__ == "__main__":
    main()
