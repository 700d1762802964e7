"""pytest's hooks for the graders: with UNIGEN_REFERENCE=1 the graders grade the answer key
(exercises/solutions/), not the student's files, and the output says so at its top and at its end, so that the
switch never silently turns stubs green."""
import os

LOUD = "graded: the solutions, not your files (UNIGEN_REFERENCE=1)"


def _reference():
    return os.environ.get("UNIGEN_REFERENCE", "") not in ("", "0")


def pytest_report_header(config):
    return [f"*** {LOUD} ***"] if _reference() else []


def pytest_sessionstart(session):
    # pytest -q hides the header: write the line anyway
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if _reference() and reporter is not None and reporter.verbosity < 0:
        reporter.write_line(f"*** {LOUD} ***", bold=True, red=True)


def pytest_terminal_summary(terminalreporter):
    if _reference():
        terminalreporter.write_line(f"*** {LOUD} ***", bold=True, red=True)
