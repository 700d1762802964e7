"""Classroom exercises: stubs (exNN_*.py, capstone_mass.py) and their graders (test_NN_*.py). See README.md."""
