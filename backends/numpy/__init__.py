"""The NumPy reference interpreter: the oracle for every pass and every other backend."""
