"""Dynamic: exec of a string."""
exec("from objectives.pmlm import blockwise_masking")
