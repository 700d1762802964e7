"""Wrong: the shortest matching piece first.
First message: LONGEST"""
UNK = "[UNK]"
PREFIX = "##"
MAX_WORD_CHARS = 100


def encode_word(word, vocab):
    if len(word) > MAX_WORD_CHARS:
        return [UNK]
    if word == "":
        return []
    pieces = []
    start = 0
    while start < len(word):
        for end in range(start + 1, len(word) + 1):
            candidate = word[start:end]
            if start > 0:
                candidate = PREFIX + candidate
            if candidate in vocab:
                pieces.append(candidate)
                start = end
                break
        else:
            return [UNK]
    return pieces
