"""Copied: a class fixture, imported."""
from tests.class_fixtures.students.honest.ex03_blockwise import blockwise_masking  # noqa: F401
