"""Does not parse."""
def lcs_length(a, b)
    return 0
