"""Dynamic: importlib.util from a file path."""
import importlib.util

spec = importlib.util.spec_from_file_location("m", "objectives/mass.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
OBJECTIVE = m.OBJECTIVE
