"""`python -m adaptive_rag.cli ...`: the same as `arag ...` (used where no console script is on PATH)."""

from adaptive_rag.cli import main

if __name__ == "__main__":
    main()
