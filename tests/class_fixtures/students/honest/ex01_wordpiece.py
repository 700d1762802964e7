"""An honest exercise 1, in other words than the answer key: a while loop that shrinks the candidate."""
UNK = "[UNK]"


def encode_word(word, vocab):
    if len(word) > 100:
        return [UNK]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        piece = None
        while end > start:
            candidate = word[start:end] if start == 0 else "##" + word[start:end]
            if candidate in vocab:
                piece = candidate
                break
            end -= 1
        if piece is None:
            return [UNK]
        pieces.append(piece)
        start = end
    return pieces
