"""The lab's experiments: one module per question, each keeping its question, its plan and its report (`python -m lab.experiments.<name>`; make targets in the Makefile)."""
