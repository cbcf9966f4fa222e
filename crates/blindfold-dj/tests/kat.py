#!/usr/bin/env python3
"""Known-answer vectors for blindfold-dj, computed with nothing but Python's integers.

Independent of the Rust code on purpose: encryption is the textbook formula with pow(), and each
vector is checked here by decrypting the slow way (c^lambda, then the layer-by-layer logarithm
modulo n^(j+1), then times lambda^-1), not by the CRT route the crate takes.

    python3 crates/blindfold-dj/tests/kat.py > crates/blindfold-dj/tests/kat_vectors.txt

Records are blocks of `name = hex` lines separated by blank lines. Every record has p, q, s, m, r
and c = (1+n)^m r^(n^s) mod n^(s+1). An onion record also has inner_s, inner_m and inner_r: then
m itself is the ciphertext E_inner_s(inner_m; inner_r), so c has two layers.
"""

import hashlib
import math

SMALL_PRIMES = [p for p in range(3, 2000) if all(p % d for d in range(2, int(p**0.5) + 1))]


def stream(label):
    """Deterministic bytes: SHA-256 of the label and a counter."""
    counter = 0
    while True:
        yield from hashlib.sha256(f"{label}/{counter}".encode()).digest()
        counter += 1


def take_int(gen, bits):
    nbytes = (bits + 7) // 8
    x = int.from_bytes(bytes(next(gen) for _ in range(nbytes)), "big")
    return x >> (nbytes * 8 - bits)


def is_probable_prime(x):
    if x < 2:
        return False
    for p in SMALL_PRIMES:
        if x % p == 0:
            return x == p
    d, r = x - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]:
        y = pow(a, d, x)
        if y in (1, x - 1):
            continue
        for _ in range(r - 1):
            y = y * y % x
            if y == x - 1:
                break
        else:
            return False
    return True


def prime(label, bits):
    gen = stream(label)
    while True:
        x = take_int(gen, bits) | (3 << (bits - 2)) | 1
        if is_probable_prime(x):
            return x


def encrypt(n, s, m, r):
    mod = n ** (s + 1)
    assert 0 <= m < n**s and 0 < r < n and math.gcd(r, n) == 1
    return pow(1 + n, m, mod) * pow(r, n**s, mod) % mod


def decrypt(p, q, s, c):
    n = p * q
    lam = (p - 1) * (q - 1) // math.gcd(p - 1, q - 1)
    a = pow(c, lam, n ** (s + 1))  # = (1+n)^(m lam)
    # Logarithm base 1+n, one base-n digit per round: subtract the binomial terms k >= 2.
    i = 0
    for j in range(1, s + 1):
        t = (a % n ** (j + 1) - 1) // n
        for k in range(2, j + 1):
            t -= math.comb(i, k) * n ** (k - 1)
        i = t % n**j
    return i * pow(lam, -1, n**s) % n**s


def unit(label, n):
    gen = stream(label)
    while True:
        r = take_int(gen, n.bit_length())
        if 0 < r < n and math.gcd(r, n) == 1:
            return r


def record(fields):
    return "\n".join(f"{k} = {v:x}" for k, v in fields) + "\n"


def main():
    out = []
    for bits in (256, 512):
        p = prime(f"kat-p-{bits}", bits // 2)
        q = prime(f"kat-q-{bits}", bits // 2)
        n = p * q
        for s in (1, 2, 3):
            for idx, m in enumerate([0, 1, n**s - 1, take_int(stream(f"m-{bits}-{s}"), (n**s).bit_length() - 1)]):
                r = unit(f"r-{bits}-{s}-{idx}", n)
                c = encrypt(n, s, m, r)
                assert decrypt(p, q, s, c) == m
                out.append(record([("p", p), ("q", q), ("s", s), ("m", m), ("r", r), ("c", c)]))
        # Onion: a layer-1 ciphertext wrapped at layer 2, and a layer-2 one wrapped at layer 3.
        for inner_s in (1, 2):
            inner_m = take_int(stream(f"onion-m-{bits}-{inner_s}"), n.bit_length() - 1)
            inner_r = unit(f"onion-r1-{bits}-{inner_s}", n)
            inner_c = encrypt(n, inner_s, inner_m, inner_r)
            r = unit(f"onion-r2-{bits}-{inner_s}", n)
            c = encrypt(n, inner_s + 1, inner_c, r)
            assert decrypt(p, q, inner_s, decrypt(p, q, inner_s + 1, c)) == inner_m
            out.append(record([("p", p), ("q", q), ("s", inner_s + 1), ("m", inner_c), ("r", r), ("c", c),
                               ("inner_s", inner_s), ("inner_m", inner_m), ("inner_r", inner_r)]))
    print("\n".join(out), end="")


if __name__ == "__main__":
    main()
